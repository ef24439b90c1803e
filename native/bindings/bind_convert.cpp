// Glue only: Python objects <-> otelprof::Options / ConvertOutput. The GIL is released while
// converting, and taken again only to call the resource composer (once per trace) and to take
// each request, as it is written, into a bytes object (no request is held in C++ meanwhile).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "otelprof/convert.hpp"
#include "otelprof/hugepages.hpp"
#include "otelprof/json.hpp"
#ifdef OTELPROF_HAVE_ZLIB
#include "otelprof/convert_gzip.hpp"
#include "otelprof/gzip.hpp"
#endif

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

// ConvertOptions._native_resource(host_name, rank, world_size, backend, gpu_models, run_id)
// -> ([(key, str | int | float | bool)], values cut), called with the GIL taken.
otelprof::ResourceComposer resource_composer(py::function compose) {
    auto shared = std::make_shared<py::function>(std::move(compose));
    return [shared](const otelprof::ResourceFacts& f) {
        py::gil_scoped_acquire gil;
        auto opt_str = [](const std::optional<std::string_view>& v) -> py::object {
            return v ? py::object(py::str(v->data(), v->size())) : py::object(py::none());
        };
        auto opt_int = [](const std::optional<int64_t>& v) -> py::object {
            return v ? py::object(py::int_(*v)) : py::object(py::none());
        };
        py::list gpus;
        if (f.gpu_models)
            for (std::string_view g : *f.gpu_models) gpus.append(py::str(g.data(), g.size()));
        const py::tuple result = (*shared)(opt_str(f.host_name), opt_int(f.rank), opt_int(f.world_size),
                                           py::str(f.backend.data(), f.backend.size()), gpus,
                                           py::str(f.run_id.data(), f.run_id.size()));
        otelprof::ComposedResource out;
        for (const py::handle& item : result[0].cast<py::list>()) {
            const auto kv = item.cast<py::tuple>();
            const py::handle v = kv[1];
            otelprof::ResourceAttrValue value;
            if (py::isinstance<py::bool_>(v)) value = v.cast<bool>();
            else if (py::isinstance<py::int_>(v)) value = v.cast<int64_t>();
            else if (py::isinstance<py::float_>(v)) value = v.cast<double>();
            else value = v.cast<std::string>();
            out.attributes.emplace_back(kv[0].cast<std::string>(), std::move(value));
        }
        out.values_cut = result[1].cast<int64_t>();
        return out;
    };
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
    // required by the time a trace is built (build_spans throws std::invalid_argument without it)
    if (d.contains("resource") && !d["resource"].is_none())
        o.compose_resource = resource_composer(d["resource"].cast<py::function>());
    o.group_by_input_shapes = get_or<bool>(d, "group_by_input_shapes", false);
    o.scope_version = get_or<std::string>(d, "scope_version", "");
    if (d.contains("source_file") && !d["source_file"].is_none()) o.source_file = d["source_file"].cast<std::string>();
    if (d.contains("execution_trace_file") && !d["execution_trace_file"].is_none())
        o.execution_trace_file = d["execution_trace_file"].cast<std::string>();
    o.threads = get_or<int64_t>(d, "threads", o.threads);
    o.split_from_bytes = get_or<int64_t>(d, "split_from_bytes", o.split_from_bytes);  // (tests: 0 splits any trace)
    o.parallel_from = get_or<int64_t>(d, "parallel_from", o.parallel_from);
    if (d.contains("live_steps")) {
        // [(number, trace id, span id, [(span id, start, end)], trigger, start, end)], validated by
        // ConvertOptions
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
            if (t.size() > 6) {
                ls.start = t[5].cast<int64_t>();
                ls.end = t[6].cast<int64_t>();
            }
            o.live_steps.push_back(std::move(ls));
        }
    }
    if (d.contains("op_attributes")) {  // {record function id: [(key, str | int | float | bool)]}, validated
        for (const auto& [id, attrs] : d["op_attributes"].cast<py::dict>()) {
            auto& out = o.op_attributes[id.cast<int64_t>()];
            for (const py::handle& item : attrs.cast<py::list>()) {
                const auto kv = item.cast<py::tuple>();
                const py::handle v = kv[1];
                otelprof::ResourceAttrValue value;
                if (py::isinstance<py::bool_>(v)) value = v.cast<bool>();
                else if (py::isinstance<py::int_>(v)) value = v.cast<int64_t>();
                else if (py::isinstance<py::float_>(v)) value = v.cast<double>();
                else value = v.cast<std::string>();
                out.emplace_back(kv[0].cast<std::string>(), std::move(value));
            }
        }
    }
    if (d.contains("live_match") && !d["live_match"].is_none()) {
        const std::string how = d["live_match"].cast<std::string>();
        if (how == "time") o.live_match = otelprof::LiveMatch::time;
        else if (how != "number") throw py::value_error("live_match must be 'number' or 'time', not '" + how + "'");
    }
    return o;
}

// The requests as Python bytes objects, each written in place (otelprof::RequestStore): the GIL
// is taken only to create a request's object and to cut it to size and append it (a training
// loop beside a window's conversion is not held up for the megabytes of a request); it is filled
// without the GIL, as no other thread can see it yet.
class BytesStore final : public otelprof::RequestStore {
  public:
    explicit BytesStore(py::list& requests) : requests_(requests) {}
    BytesStore(const BytesStore&) = delete;
    BytesStore& operator=(const BytesStore&) = delete;
    ~BytesStore() override {
        if (open_.empty()) return;
        py::gil_scoped_acquire gil;  // a conversion that failed while writing requests
        for (auto& [buffer, request] : open_) Py_DECREF(request);
    }

    char* open(size_t capacity) override {
        py::gil_scoped_acquire gil;
        PyObject* request = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(capacity));
        if (!request) fail();
        char* p = PyBytes_AS_STRING(request);
        open_.emplace(p, request);
        // its fresh pages (the payload: tens of MiB for a large trace) as huge pages where the
        // system allows them on request: faulted in 4 KiB at a time, they took over half the time
        // the requests took to write
        otelprof::advise_huge_pages(p, capacity);
        return p;
    }

    // The pages a request is about to fill, faulted in with one call (Linux 5.14+; advisory).
    void ready([[maybe_unused]] char* p, [[maybe_unused]] size_t n) override {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
        static const auto kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
        const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + n;
        const uintptr_t page_begin = (begin + kPage - 1) & ~(kPage - 1), page_end = end & ~(kPage - 1);
        if (page_end > page_begin) madvise(reinterpret_cast<void*>(page_begin), page_end - page_begin, MADV_POPULATE_WRITE);
#endif
    }

    char* grow(char* buffer, size_t capacity) override {
        py::gil_scoped_acquire gil;
        PyObject* request = resized(buffer, capacity);
        char* p = PyBytes_AS_STRING(request);
        open_.emplace(p, request);
        return p;
    }

    void close(char* buffer, size_t size) override {
        py::gil_scoped_acquire gil;
        requests_.append(py::reinterpret_steal<py::object>(resized(buffer, size)));
    }

  private:
    py::list& requests_;
    std::unordered_map<const char*, PyObject*> open_;  // the requests being written, by buffer

    [[noreturn]] void fail() {
        PyErr_Clear();
        throw std::bad_alloc();
    }
    // The open request of `buffer`, taken out of the open ones and cut (or extended) to `size`
    // (the GIL held): realloc, which keeps a large block's pages in place. On failure it is freed.
    // _PyBytes_Resize is CPython's underscore API (Include/cpython/bytesobject.h, outside the
    // limited API), the one way to cut or extend a bytes object in place: the public route, a
    // second bytes object and a copy, costs every request a copy and fresh pages (faulting a
    // request's pages in once took over half the time of writing it). PEP 782 keeps it available
    // and maintained in 3.15 (soft-deprecated there; PyBytesWriter is its public successor).
    // Guarded at compile time: an error where it cannot exist, a warning (an error in CI) past the
    // versions whose documentation was read for it.
#if defined(Py_LIMITED_API)
#error "BytesStore cuts requests with _PyBytes_Resize, which the limited API does not have"
#endif
#if PY_VERSION_HEX >= 0x03100000
#warning "_PyBytes_Resize was reviewed up to CPython 3.15 (PEP 782 keeps it): review it again, or move BytesStore to PyBytesWriter"
#endif
    PyObject* resized(const char* buffer, size_t size) {
        auto it = open_.find(buffer);
        if (it == open_.end()) throw std::logic_error("a request closed or grown that was not open");
        PyObject* request = it->second;
        open_.erase(it);
        if (_PyBytes_Resize(&request, static_cast<Py_ssize_t>(size)) != 0) fail();  // (it freed the object)
        return request;
    }
};

// What convert() returns: named fields, not a tuple (otelprof/_native.pyi ConvertOutput).
struct PyConvertOutput {
    py::list requests;
    std::vector<otelprof::OpRow> ops;
    py::dict stats;
    py::dict phases;
    std::string window_id;
};

std::string_view contiguous(const py::buffer_info& buf, const char* fn) {
    if (buf.ndim > 1 || (buf.ndim == 1 && buf.strides[0] != buf.itemsize))
        throw py::type_error(std::string(fn) + "() needs a contiguous bytes-like object");
    return {static_cast<const char*>(buf.ptr), static_cast<size_t>(buf.size * buf.itemsize)};
}

// Runs `convert(opts)` with the GIL released; each request is written straight into a new Python
// bytes object (BytesStore), so none is held twice.
template <typename Convert>
PyConvertOutput converted(otelprof::Options& opts, Convert&& convert) {
    PyConvertOutput result;
    BytesStore store(result.requests);
    opts.request_store = &store;
    otelprof::ConvertOutput out;
    {
        py::gil_scoped_release release;
        out = convert(opts);
    }
    for (const auto& [k, v] : out.phase_ns) result.phases[py::str(k)] = v;
    result.ops = std::move(out.ops);
    for (const auto& [k, v] : out.stats) result.stats[py::str(k)] = v;
    result.window_id = std::move(out.window_id);
    return result;
}

// `data`: bytes, or a bytearray/memoryview (inflated gzip is converted without a copy). The
// buffer stays exported, so it cannot be resized, while the GIL is released.
PyConvertOutput convert(const py::buffer& data, const py::dict& options) {
    otelprof::Options opts = to_options(options);
    const py::buffer_info buf = data.request();
    const std::string_view json = contiguous(buf, "convert");
    return converted(opts, [json](const otelprof::Options& o) { return otelprof::convert_trace(json, o); });
}

#ifdef OTELPROF_HAVE_ZLIB
// Gzip bytes, inflated on a second thread while the first parses (convert_gzip.hpp).
PyConvertOutput convert_gzip(const py::buffer& data, const py::dict& options, uint64_t limit) {
    otelprof::Options opts = to_options(options);
    const py::buffer_info buf = data.request();
    const std::string_view gz = contiguous(buf, "convert_gzip");
    return converted(opts, [gz, limit](const otelprof::Options& o) { return otelprof::convert_gzip(gz, limit, o); });
}
#endif

}  // namespace

void bind_convert(py::module_& m) {
    py::register_exception<otelprof::TraceError>(m, "TraceError", PyExc_ValueError);
    py::class_<otelprof::OpRow>(m, "OpRow", "One key_averages() row; times in nanoseconds.")
        .def_readonly("name", &otelprof::OpRow::name)
        .def_readonly("kind", &otelprof::OpRow::kind)
        .def_readonly("input_shapes", &otelprof::OpRow::input_shapes)
        .def_readonly("calls", &otelprof::OpRow::calls)
        .def_readonly("cpu_total_ns", &otelprof::OpRow::cpu_total_ns)
        .def_readonly("self_cpu_ns", &otelprof::OpRow::self_cpu_ns)
        .def_readonly("device_total_ns", &otelprof::OpRow::device_total_ns)
        .def_readonly("self_device_ns", &otelprof::OpRow::self_device_ns);
    py::class_<PyConvertOutput>(m, "ConvertOutput", "What convert() returns.")
        .def_readonly("requests", &PyConvertOutput::requests)
        .def_readonly("ops", &PyConvertOutput::ops)
        .def_readonly("stats", &PyConvertOutput::stats)
        .def_readonly("phases", &PyConvertOutput::phases)
        .def_readonly("window_id", &PyConvertOutput::window_id);
    m.def("convert", &convert, py::arg("data"), py::arg("options"),
          "Convert Kineto JSON bytes into a ConvertOutput. Raises TraceError (ValueError).");
#ifdef OTELPROF_HAVE_ZLIB
    py::register_exception<otelprof::GzipError>(m, "GzipError", m.attr("TraceError"));
    m.def("convert_gzip", &convert_gzip, py::arg("data"), py::arg("options"), py::arg("limit"),
          "Convert gzip bytes (every member; more than `limit` bytes inflated, corrupt or truncated "
          "data, or an empty trace raise GzipError, a TraceError) into a ConvertOutput, inflating "
          "on a second thread while parsing. Raises TraceError for the JSON as convert() does.");
#endif
}
