// Glue only: Kineto JSON bytes -> the stack samples of stacks.hpp, computed with the GIL released;
// capture/profiles/stacks.py builds its Samples from them (frames and stacks once each, not per
// event).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "otelprof/stacks.hpp"

namespace py = pybind11;

namespace {

// What stack_samples() returns (otelprof/_native.pyi StackSamples).
struct PyStackSamples {
    py::list frames;  // (name, file, line)
    py::list stacks;  // (parent stack or -1, frame)
    py::list cpu;     // (stack, step or None, ns)
    py::list device;
    int64_t start_ns = 0, end_ns = 0;
};

// A 128-bit sum as a Python int (beyond int64 only for sums of very long durations).
py::object wide_int(__int128 v) {
    if (v >= INT64_MIN && v <= INT64_MAX) return py::int_(static_cast<int64_t>(v));
    const py::int_ high(static_cast<int64_t>(v >> 64)), low(static_cast<uint64_t>(v));
    return (high << py::int_(64)) + low;
}

void values_into(py::list& into, const std::vector<otelprof::StackValue>& values) {
    for (const auto& v : values) {
        py::object step = v.step >= 0 ? py::object(py::int_(v.step)) : py::object(py::none());
        into.append(py::make_tuple(v.stack, std::move(step), wide_int(v.ns)));
    }
}

PyStackSamples stack_samples(const py::buffer& data, std::optional<int64_t> base_time_ns) {
    const py::buffer_info buf = data.request();
    if (buf.ndim > 1 || (buf.ndim == 1 && buf.strides[0] != buf.itemsize))
        throw py::type_error("stack_samples() needs a contiguous bytes-like object");
    const std::string_view json(static_cast<const char*>(buf.ptr), static_cast<size_t>(buf.size * buf.itemsize));
    otelprof::StackSamples out;
    {
        py::gil_scoped_release release;
        out = otelprof::stack_samples(json, base_time_ns);
    }
    PyStackSamples result;
    for (const auto& f : out.frames) result.frames.append(py::make_tuple(py::str(f.name), py::str(f.file), f.line));
    for (const auto& s : out.stacks) result.stacks.append(py::make_tuple(s.parent, s.frame));
    values_into(result.cpu, out.cpu);
    values_into(result.device, out.device);
    result.start_ns = out.start_ns;
    result.end_ns = out.end_ns;
    return result;
}

}  // namespace

void bind_stacks(py::module_& m) {
    py::class_<PyStackSamples>(m, "StackSamples", "What stack_samples() returns.")
        .def_readonly("frames", &PyStackSamples::frames)
        .def_readonly("stacks", &PyStackSamples::stacks)
        .def_readonly("cpu", &PyStackSamples::cpu)
        .def_readonly("device", &PyStackSamples::device)
        .def_readonly("start_ns", &PyStackSamples::start_ns)
        .def_readonly("end_ns", &PyStackSamples::end_ns);
    m.def("stack_samples", &stack_samples, py::arg("data"), py::arg("base_time_ns") = py::none(),
          "The stack samples of Kineto JSON bytes (capture/profiles/stacks.py). Raises TraceError (ValueError).");
}
