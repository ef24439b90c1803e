// Glue only: StepRecord tuples from otelprof/capture/spans/step_spans.py -> StepRecords, read with the C API (a
// batch holds hundreds of steps; this is the part that needs the GIL), then encoded without it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>

#include "otelprof/step_spans.hpp"
#include "step_spans_py.hpp"

namespace py = pybind11;

// UTF-8 of a str; lone surrogates become U+FFFD, as converter/_text.clean does.
std::string utf8(PyObject* obj) {
    if (!PyUnicode_Check(obj)) throw py::type_error("expected a str");
    Py_ssize_t n = 0;
    if (const char* s = PyUnicode_AsUTF8AndSize(obj, &n)) return std::string(s, static_cast<size_t>(n));
    PyErr_Clear();
    std::string out;
    const Py_ssize_t len = PyUnicode_GET_LENGTH(obj);
    const int kind = PyUnicode_KIND(obj);
    const void* data = PyUnicode_DATA(obj);
    for (Py_ssize_t k = 0; k < len; ++k) {
        Py_UCS4 c = PyUnicode_READ(kind, data, k);
        if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD;
        if (c < 0x80) {
            out += static_cast<char>(c);
        } else if (c < 0x800) {
            out += static_cast<char>(0xC0 | (c >> 6));
            out += static_cast<char>(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            out += static_cast<char>(0xE0 | (c >> 12));
            out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (c & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (c >> 18));
            out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (c & 0x3F));
        }
    }
    return out;
}

namespace {
std::optional<int64_t> optional_integer(PyObject* obj);
PyObject* item(PyObject* tuple, Py_ssize_t k, Py_ssize_t size);
}  // namespace

otelprof::StepMemory step_memory(PyObject* obj) {
    otelprof::StepMemory m;
    if (obj == Py_None) return m;
    m.allocated = optional_integer(item(obj, 0, 4));
    m.reserved = optional_integer(item(obj, 1, 4));
    m.resident = optional_integer(item(obj, 2, 4));
    m.ooms = optional_integer(item(obj, 3, 4)).value_or(0);
    return m;
}

namespace {

// The bytes ids are hashed from: UTF-8 with surrogates passed through (reference/ids.py).
std::string id_key(const py::str& s) {
    py::object raw = py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(s.ptr(), "utf-8", "surrogatepass"));
    if (!raw) throw py::error_already_set();
    return raw.cast<std::string>();
}

int64_t integer(PyObject* obj) {
    const long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    return v;
}

std::optional<int64_t> optional_integer(PyObject* obj) {
    if (obj == Py_None) return std::nullopt;
    return integer(obj);
}

template <typename Id>
std::optional<Id> optional_id(PyObject* obj) {
    if (obj == Py_None) return std::nullopt;
    char* data = nullptr;
    Py_ssize_t n = 0;
    if (!PyBytes_Check(obj) || PyBytes_AsStringAndSize(obj, &data, &n) != 0 || static_cast<size_t>(n) != Id().size())
        throw py::value_error("a trace id is 16 bytes, a span id 8");
    Id id;
    std::memcpy(id.data(), data, id.size());
    return id;
}

PyObject* item(PyObject* tuple, Py_ssize_t k, Py_ssize_t size) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != size) throw py::type_error("malformed step record");
    return PyTuple_GET_ITEM(tuple, k);
}

// A step record has 13 fields, or 14 with `skipped`, or 15 with `memory` (StepRecord's last,
// defaulted).
Py_ssize_t record_size(PyObject* t) {
    const Py_ssize_t n = PyTuple_Check(t) ? PyTuple_GET_SIZE(t) : 0;
    return n == 14 || n == 15 ? n : 13;
}

// (name, number, start_ns, end_ns, ordinal, trace_id|None, parent_id|None, samples|None,
//  tokens|None, dropped_phases, [(phase, start_ns, end_ns, module|None), ...], micro_batches, window|None
//  [, skipped[, memory]])
otelprof::StepRecord to_record(PyObject* t) {
    const Py_ssize_t kSize = record_size(t);
    otelprof::StepRecord r;
    r.name = utf8(item(t, 0, kSize));
    r.number = integer(item(t, 1, kSize));
    r.start = integer(item(t, 2, kSize));
    r.end = integer(item(t, 3, kSize));
    r.ordinal = static_cast<uint64_t>(integer(item(t, 4, kSize)));
    r.trace_id = optional_id<otelprof::TraceId>(item(t, 5, kSize));
    r.parent_id = optional_id<otelprof::SpanId>(item(t, 6, kSize));
    r.samples = optional_integer(item(t, 7, kSize));
    r.tokens = optional_integer(item(t, 8, kSize));
    r.dropped_phases = integer(item(t, 9, kSize));
    r.micro_batches = integer(item(t, 11, kSize));
    PyObject* window = item(t, 12, kSize);
    if (window != Py_None) r.window = utf8(window);
    if (kSize == 15) r.memory = step_memory(item(t, 14, kSize));
    if (kSize >= 14) {
        const int truth = PyObject_IsTrue(item(t, 13, kSize));
        if (truth < 0) throw py::error_already_set();
        r.skipped = truth == 1;
    }
    PyObject* phases = item(t, 10, kSize);
    if (!PyList_Check(phases)) throw py::type_error("a step's phases are a list");
    const Py_ssize_t n = PyList_GET_SIZE(phases);
    r.phases.reserve(static_cast<size_t>(n));
    for (Py_ssize_t k = 0; k < n; ++k) {
        PyObject* p = PyList_GET_ITEM(phases, k);
        PyObject* module = item(p, 3, 4);
        r.phases.push_back({utf8(item(p, 0, 4)), integer(item(p, 1, 4)), integer(item(p, 2, 4)),
                            module == Py_None ? std::string() : utf8(module)});
    }
    return r;
}

otelprof::ResourceValue resource_value(const py::handle& v) {
    if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
    if (py::isinstance<py::int_>(v)) return v.cast<int64_t>();
    if (py::isinstance<py::float_>(v)) return v.cast<double>();
    if (py::isinstance<py::str>(v)) return utf8(v.ptr());
    throw py::type_error("resource attribute values are str, int, float or bool");
}

}  // namespace

PyStepSpanEncoder::PyStepSpanEncoder(const py::list& resource, const py::str& scope_version,
                                     const py::str& trace_prefix, uint64_t span_base)
    : encoder_(to_resource(resource), utf8(scope_version.ptr()), id_key(trace_prefix), span_base) {}

py::list PyStepSpanEncoder::encode(const py::list& steps, size_t max_bytes) const {
    std::vector<otelprof::StepRecord> records;
    records.reserve(steps.size());
    for (const py::handle& t : steps) records.push_back(to_record(t.ptr()));
    return encode_records(records, max_bytes);
}

py::list PyStepSpanEncoder::encode_records(const std::vector<otelprof::StepRecord>& records, size_t max_bytes) const {
    std::vector<otelprof::Request> requests;
    {
        py::gil_scoped_release release;
        requests = encoder_.encode(records, max_bytes);
    }
    py::list out;
    for (auto& r : requests) {
        const std::string_view b = r.bytes();
        out.append(py::bytes(b.data(), b.size()));
        r.data.reset();
    }
    return out;
}

std::vector<std::pair<std::string, otelprof::ResourceValue>> PyStepSpanEncoder::to_resource(const py::list& resource) {
    std::vector<std::pair<std::string, otelprof::ResourceValue>> out;
    for (const py::handle& kv : resource) {
        const auto pair = kv.cast<py::tuple>();
        if (pair.size() != 2) throw py::type_error("resource attributes are (key, value) pairs");
        out.emplace_back(utf8(pair[0].ptr()), resource_value(pair[1]));
    }
    return out;
}

void bind_step_spans(py::module_& m) {
    py::class_<PyStepSpanEncoder>(m, "StepSpanEncoder")
        .def(py::init<const py::list&, const py::str&, const py::str&, uint64_t>(), py::arg("resource"),
             py::arg("scope_version"), py::arg("trace_prefix"), py::arg("span_base"))
        .def("encode", &PyStepSpanEncoder::encode, py::arg("steps"), py::arg("max_bytes"),
             "Step records -> ExportTraceServiceRequest bytes, each at most max_bytes (one step's spans "
             "may exceed it alone). Releases the GIL while encoding.");
}
