// Glue only: Python objects <-> otelprof::Options / ConvertOutput. The GIL is released while converting.
#include <optional>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "otelprof/convert.hpp"
#include "otelprof/json.hpp"
#include "otelprof/names.hpp"
#include "otelprof/schema.hpp"

namespace py = pybind11;

namespace {

template <typename T>
T get_or(const py::dict& d, const char* key, T fallback) {
    if (!d.contains(key) || d[key].is_none()) return fallback;
    return d[key].cast<T>();
}

std::optional<int64_t> non_negative(const py::dict& d, const char* key) {
    int64_t v = get_or<int64_t>(d, key, -1);
    return v >= 0 ? std::optional<int64_t>(v) : std::nullopt;
}

otelprof::Options to_options(const py::dict& d) {
    otelprof::Options o;
    if (d.contains("run_id") && !d["run_id"].is_none()) o.run_id = d["run_id"].cast<std::string>();
    o.rank = non_negative(d, "rank");
    o.world_size = non_negative(d, "world_size");
    o.base_time_ns = non_negative(d, "base_time_ns");
    o.full = get_or<bool>(d, "full", false);
    o.min_duration_ns = get_or<int64_t>(d, "min_duration_ns", o.min_duration_ns);
    o.event_limit = get_or<int64_t>(d, "event_limit", o.event_limit);
    o.link_limit = get_or<int64_t>(d, "link_limit", o.link_limit);
    o.span_budget = get_or<int64_t>(d, "span_budget", o.span_budget);
    o.split_world_size = get_or<int64_t>(d, "split_world_size", o.split_world_size);
    o.max_request_bytes = get_or<int64_t>(d, "max_request_bytes", o.max_request_bytes);
    o.attribute_value_length_limit = get_or<int64_t>(d, "attribute_value_length_limit", o.attribute_value_length_limit);
    o.resource_value_limit = get_or<int64_t>(d, "resource_value_limit", o.resource_value_limit);
    o.resource_attributes =
        get_or<std::vector<std::pair<std::string, std::string>>>(d, "resource_attributes", {});
    if (d.contains("host_name") && !d["host_name"].is_none()) o.host_name = d["host_name"].cast<std::string>();
    o.group_by_input_shapes = get_or<bool>(d, "group_by_input_shapes", false);
    o.scope_version = get_or<std::string>(d, "scope_version", "");
    if (d.contains("live_steps")) {
        // [(number, trace id, span id, [(span id, start, end)], trigger)], validated by ConvertOptions
        auto copy = [](const py::handle& b, uint8_t* out, size_t size) {
            const std::string raw = b.cast<std::string>();
            if (raw.size() != size) throw py::value_error("a live step's trace id is 16 bytes, span ids 8");
            std::copy(raw.begin(), raw.end(), out);
        };
        for (const py::handle& item : d["live_steps"].cast<py::list>()) {
            const auto t = item.cast<py::tuple>();
            otelprof::LiveStep ls;
            ls.number = t[0].cast<int64_t>();
            copy(t[1], ls.trace_id.data(), 16);
            copy(t[2], ls.span_id.data(), 8);
            for (const py::handle& ph : t[3].cast<py::list>()) {
                const auto p = ph.cast<py::tuple>();
                otelprof::LivePhase phase;
                copy(p[0], phase.span_id.data(), 8);
                phase.start = p[1].cast<int64_t>();
                phase.end = p[2].cast<int64_t>();
                ls.phases.push_back(phase);
            }
            if (t.size() > 4) ls.trigger = t[4].cast<std::string>();
            o.live_steps.push_back(std::move(ls));
        }
    }
    return o;
}

// `data`: bytes, or a bytearray/memoryview (inflated gzip is converted without a copy). The
// buffer stays exported, so it cannot be resized, while the GIL is released.
py::tuple convert(const py::buffer& data, const py::dict& options) {
    otelprof::Options opts = to_options(options);
    const py::buffer_info buf = data.request();
    if (buf.ndim > 1 || (buf.ndim == 1 && buf.strides[0] != buf.itemsize))
        throw py::type_error("convert() needs a contiguous bytes-like object");
    std::string_view json(static_cast<const char*>(buf.ptr), static_cast<size_t>(buf.size * buf.itemsize));
    otelprof::ConvertOutput out;
    {
        py::gil_scoped_release release;
        out = otelprof::convert_trace(json, opts);
    }
    py::dict phases;
    for (const auto& [k, v] : out.phase_ns) phases[py::str(k)] = v;
    py::list requests;
    for (auto& r : out.requests) {
        std::string_view b = r.bytes();
        requests.append(py::bytes(b.data(), b.size()));
        r.data.reset();  // each request's buffer is freed once copied, so they are not all held twice
    }
    py::list ops;
    for (const auto& row : out.ops)
        ops.append(py::make_tuple(row.name, row.kind, row.input_shapes, row.calls, row.cpu_total_ns, row.self_cpu_ns,
                                  row.device_total_ns, row.self_device_ns));
    py::dict stats;
    for (const auto& [k, v] : out.stats) stats[py::str(k)] = v;
    return py::make_tuple(requests, ops, stats, phases, out.window_id);
}

py::dict schema() {
    py::list args;
    static const char* type_names[] = {"int", "double", "string", "json"};
    for (int k = 0; k < otelprof::kArgAttributeCount; ++k) {
        const auto& a = otelprof::kArgAttributes[k];
        args.append(py::make_tuple(std::string(a.key), std::string(a.attr), type_names[static_cast<int>(a.type)]));
    }
    py::list memory;
    for (int k = 0; k < otelprof::kMemoryAttributeCount; ++k)
        memory.append(py::make_tuple(std::string(otelprof::kMemoryAttributes[k][0]), std::string(otelprof::kMemoryAttributes[k][1])));
    py::dict d;
    d["arg_attributes"] = args;
    d["memory_attributes"] = memory;
    return d;
}

int category_kind(const std::string& cat) { return static_cast<int>(otelprof::category_kind(cat)); }

py::object device_name(int64_t device_type, std::optional<int64_t> device_id) {
    std::string name = otelprof::device_name(device_type, device_id.has_value(), device_id.value_or(0));
    if (name.empty()) return py::none();
    return py::str(name);
}

}  // namespace

void bind_convert(py::module_& m) {
    py::register_exception<otelprof::TraceError>(m, "TraceError", PyExc_ValueError);
    m.def("convert", &convert, py::arg("data"), py::arg("options"),
          "Convert Kineto JSON bytes into (requests, op rows, stats, phases, window id). Raises TraceError (ValueError).");
    m.def("schema", &schema, "The category and argument tables, for consistency tests.");
    m.def("category_kind", &category_kind, py::arg("category"));
    m.def("fold_kernel_name", [](const std::string& name) { return otelprof::fold_kernel_name(name); }, py::arg("name"),
          "A kernel's span name (reference/names.py: fold_kernel_name), for consistency tests.");
    m.def("device_name", &device_name, py::arg("device_type"), py::arg("device_id"),
          "cpu, cuda:0, ... (reference/names.py: device_name), for consistency tests.");
}
