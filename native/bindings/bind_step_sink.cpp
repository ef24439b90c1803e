// Glue only: the step sink (otelprof/step_sink.hpp) as otelprof._native.StepSink, its readings as
// named tuples (C structseq types, like os.stat_result: fields by name, and still sequences).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "step_sink_py.hpp"

namespace py = pybind11;

namespace {

PyStructSequence_Field kHistogramFields[] = {
    {"counts", "per bucket, not cumulated; the last is +Inf"}, {"sum", "of the observed seconds"}, {nullptr, nullptr}};
PyStructSequence_Field kExemplarFields[] = {{"number", "the step's number"},
                                            {"trace_id", "the application span's trace id, or None: the step's own"},
                                            {"value", "the step's seconds"},
                                            {"at", "Unix time of the step's end"},
                                            {nullptr, nullptr}};
PyStructSequence_Field kMetricsFields[] = {
    {"duration", "StepHistogram of step seconds"},
    {"exemplars", "per duration bucket: the latest StepExemplar, or None"},
    {"phases", "StepHistogram per phase, in PHASES order"},
    {"steps", "training steps folded"},
    {"samples", "their samples"},
    {"tokens", "their tokens"},
    {"spans_dropped", "step spans dropped (the queue was full)"},
    {"last_step", "Unix time of the last step's end, or None"},
    {"samples_rate", "the last step's samples per second, or None"},
    {"tokens_rate", "the last step's tokens per second, or None"},
    {"micro_batches", "micro-batches of the steps folded"},
    {"skipped", "steps folded whose optimizer update was skipped"},
    {nullptr, nullptr}};
PyStructSequence_Field kLastFields[] = {{"number", "the step's number"},
                                        {"ordinal", "its span id ordinal (its phases take the next ones)"},
                                        {"trace_id", "the application span's trace id, or None: the step's own"},
                                        {"phases", "[(start ns, end ns)] of its phase spans"},
                                        {"phase_names", "their names, by attribute only: the tuple is the first four"},
                                        {nullptr, nullptr}};

PyStructSequence_Field kFoldedFields[] = {
    {"number", "the step's number"},
    {"seconds", "its duration"},
    {"phases", "[(phase, seconds)] of the phases it has a total of, in PHASES order"},
    {"samples", "its samples, or None"},
    {"tokens", "its tokens, or None"},
    {"micro_batches", "its micro-batches"},
    {"ordinal", "its span id ordinal"},
    {"trace_id", "the application span's trace id, or None: the step's own"},
    {nullptr, nullptr}};

PyStructSequence_Desc kHistogram = {"otelprof._native.StepHistogram", "A step-time histogram.", kHistogramFields, 2};
PyStructSequence_Desc kExemplar = {"otelprof._native.StepExemplar", "A step-duration exemplar.", kExemplarFields, 4};
PyStructSequence_Desc kMetrics = {"otelprof._native.StepSinkMetrics", "The step metrics folded so far.",
                                  kMetricsFields, 12};
PyStructSequence_Desc kLast = {"otelprof._native.LastStep", "The step the sink queued last.", kLastFields, 4};
PyStructSequence_Desc kFolded = {"otelprof._native.FoldedStep", "The training step the sink folded last.",
                                 kFoldedFields, 8};

PyTypeObject* histogram_type = nullptr;
PyTypeObject* exemplar_type = nullptr;
PyTypeObject* metrics_type = nullptr;
PyTypeObject* last_type = nullptr;
PyTypeObject* folded_type = nullptr;
constexpr const char* kPhaseNames[otelprof::kPhaseCount] = {"data", "forward", "backward", "optimizer"};

py::object optional_int(const std::optional<int64_t>& v) { return v ? py::object(py::int_(*v)) : py::none(); }

// A structseq of `type` holding `items` (in field order).
py::object named(PyTypeObject* type, std::vector<py::object> items) {
    PyObject* obj = PyStructSequence_New(type);
    if (obj == nullptr) throw py::error_already_set();
    for (size_t i = 0; i < items.size(); ++i) {
        PyStructSequence_SetItem(obj, static_cast<Py_ssize_t>(i), items[i].release().ptr());  // steals
    }
    return py::reinterpret_steal<py::object>(obj);
}

py::object histogram(const otelprof::StepHistogram& h) {
    py::list counts;
    for (uint64_t c : h.counts) counts.append(c);
    return named(histogram_type, {std::move(counts), py::float_(h.sum)});
}

py::object optional_float(const std::optional<double>& v) { return v ? py::object(py::float_(*v)) : py::none(); }

py::object trace_bytes(const std::optional<otelprof::TraceId>& id) {
    return id ? py::object(py::bytes(reinterpret_cast<const char*>(id->data()), 16)) : py::none();
}

PyTypeObject* new_type(PyStructSequence_Desc& desc) {
    PyTypeObject* type = PyStructSequence_NewType(&desc);
    if (type == nullptr) throw py::error_already_set();
    return type;
}

}  // namespace

py::object PyStepSink::metrics() const {
    const otelprof::StepMetricsState m = sink.metrics();
    py::list exemplars;
    for (const otelprof::StepExemplar& e : m.exemplars) {
        if (e.number < 0) {
            exemplars.append(py::none());
            continue;
        }
        exemplars.append(named(exemplar_type, {py::int_(e.number), trace_bytes(e.trace_id), py::float_(e.value),
                                               py::float_(e.at)}));
    }
    py::list phases;
    for (const otelprof::StepHistogram& h : m.phases) phases.append(histogram(h));
    return named(metrics_type, {histogram(m.duration), std::move(exemplars), std::move(phases), py::int_(m.steps),
                                py::int_(m.samples), py::int_(m.tokens), py::int_(m.spans_dropped),
                                optional_float(m.last_step), optional_float(m.samples_rate),
                                optional_float(m.tokens_rate), py::int_(m.micro_batches), py::int_(m.skipped)});
}

py::list PyStepSink::encode(const PyStepSpanEncoder& encoder, size_t max_bytes) {
    const std::vector<otelprof::StepRecord> records = sink.take();
    if (records.empty()) return py::list();
    return encoder.encode_records(records, max_bytes);
}

py::object PyStepSink::last() const {
    const otelprof::StepRecord* r = sink.last();
    if (r == nullptr) return py::none();
    py::list phases;
    py::tuple names(r->phases.size());
    for (size_t i = 0; i < r->phases.size(); ++i) {
        phases.append(py::make_tuple(r->phases[i].start, r->phases[i].end));
        names[i] = py::str(r->phases[i].name);
    }
    return named(last_type, {py::int_(r->number), py::int_(r->ordinal), trace_bytes(r->trace_id), std::move(phases),
                             std::move(names)});
}

py::object PyStepSink::held() const {
    const otelprof::HeldStep* h = sink.held();
    if (h == nullptr) return py::none();
    py::list phases;
    for (const otelprof::PhaseSpan& p : h->step.phases) phases.append(py::make_tuple(p.start, p.end));
    return py::make_tuple(h->step.number, h->step.start, h->step.end, std::move(phases), h->step.dropped_phases);
}

py::tuple PyStepSink::release(const py::object& end, const py::object& phases) {
    otelprof::StepAdded added;
    if (end.is_none()) {
        added = sink.release(nullptr);
    } else {
        otelprof::DeviceTimes device;
        device.end = end.cast<int64_t>();
        for (const py::handle p : phases) {
            const auto pair = p.cast<py::tuple>();
            device.phases.emplace_back(pair[0].cast<int64_t>(), pair[1].cast<int64_t>());
        }
        try {
            added = sink.release(&device);
        } catch (const std::invalid_argument& e) {
            throw py::value_error(e.what());
        }
    }
    return py::make_tuple(added.boundary, added.wake);
}

py::object PyStepSink::folded() const {
    const otelprof::StepFolded f = sink.folded();
    if (f.number < 0) return py::none();
    py::list phases;
    for (int k = 0; k < otelprof::kPhaseCount; ++k) {
        if (f.with_total & (1u << k))
            phases.append(py::make_tuple(kPhaseNames[k], static_cast<double>(f.totals[static_cast<size_t>(k)]) / 1e9));
    }
    return named(folded_type, {py::int_(f.number), py::float_(f.seconds), std::move(phases), optional_int(f.samples),
                               optional_int(f.tokens), py::int_(f.micro_batches), py::int_(f.ordinal),
                               trace_bytes(f.trace_id)});
}

void bind_step_sink(py::module_& m) {
    histogram_type = new_type(kHistogram);
    exemplar_type = new_type(kExemplar);
    metrics_type = new_type(kMetrics);
    last_type = new_type(kLast);
    folded_type = new_type(kFolded);
    m.attr("StepHistogram") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(histogram_type));
    m.attr("StepExemplar") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(exemplar_type));
    m.attr("StepSinkMetrics") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(metrics_type));
    m.attr("LastStep") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(last_type));
    m.attr("FoldedStep") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(folded_type));
    py::class_<PyStepSink, std::shared_ptr<PyStepSink>>(m, "StepSink")
        .def(py::init<size_t, size_t>(), py::arg("max_pending"), py::arg("batch_steps"))
        .def("metrics", &PyStepSink::metrics, "The step metrics folded so far (a StepSinkMetrics).")
        .def("encode", &PyStepSink::encode, py::arg("encoder"), py::arg("max_bytes"),
             "The queued steps' spans as request bytes (the queue empties); the GIL is released to encode.")
        .def_property_readonly("pending", [](const PyStepSink& s) { return s.sink.pending(); })
        .def_property_readonly("spans_dropped", [](const PyStepSink& s) { return s.sink.metrics().spans_dropped; })
        .def("clear_queue", [](PyStepSink& s) { s.sink.clear_queue(); })
        .def(
            "set_memory", [](PyStepSink& s, const py::object& memory) { s.sink.set_memory(step_memory(memory.ptr())); },
            py::arg("memory"),
            "The memory of the training step closing next: (allocated, reserved, resident bytes or None, "
            "out-of-memory errors caught), or None.")
        .def(
            "start_resident", [](PyStepSink& s) { return s.sink.resident.start(); },
            "From now on each training step's resident peak is read natively (memory_peaks.ResidentPeaks' "
            "twin); returns '' or why /proc/self could not be opened (then the current RSS).")
        .def(
            "stop_resident", [](PyStepSink& s) { s.sink.resident.stop(); }, "The resident readings stop.")
        .def(
            "read_resident",
            [](PyStepSink& s) -> py::object {
                if (!s.sink.resident.on()) return py::none();
                return optional_int(s.sink.resident.read());
            },
            "A resident peak read now (bytes; the mark restarts), or None (off, or the read failed).")
        .def_property_readonly("resident_exact", [](const PyStepSink& s) { return s.sink.resident.exact(); })
        .def_static(
            "resident_kept_kib", &otelprof::ResidentPeaks::kept_kib,
            "KiB: the process's lifetime resident high-water mark the native resets took away.")
        .def_static(
            "vm_hwm_kib",
            [](const py::bytes& status) -> py::object {
                return optional_int(otelprof::ResidentPeaks::vm_hwm_kib(std::string(status)));
            },
            py::arg("status"), "VmHWM (KiB) from /proc/<pid>/status text, or None.")
        .def(
            "last_memory",
            [](const PyStepSink& s) -> py::object {
                const std::optional<otelprof::StepMemory>& m = s.sink.last_memory();
                if (!m) return py::none();
                return py::make_tuple(optional_int(m->allocated), optional_int(m->reserved), optional_int(m->resident),
                                      m->ooms);
            },
            "The memory the last training step took: (allocated, reserved, resident, ooms), or None.")
        .def(
            "reserve", [](PyStepSink& s, size_t count) { return s.sink.reserve(count); }, py::arg("count"),
            "Span id ordinals for `count` spans made outside the sink (a failed step's): the first.")
        .def("last", &PyStepSink::last, "The step queued last (a LastStep), or None.")
        .def("folded", &PyStepSink::folded, "The training step folded last (a FoldedStep), or None.")
        .def(
            "hold", [](PyStepSink& s, size_t max_held) { s.sink.hold(max_held); }, py::arg("max_held"),
            "Device-timed steps: hold each closed step until release() (past max_held, the oldest is "
            "released with its CPU times).")
        .def("held", &PyStepSink::held,
             "The oldest held step as (number, start ns, end ns, [(start ns, end ns)] of its phases, "
             "dropped phases), CPU times; or None.")
        .def("release", &PyStepSink::release, py::arg("end") = py::none(), py::arg("phases") = py::none(),
             "Folds and queues the oldest held step, with its device times (end ns, [(start ns, end ns)] per "
             "phase) or, end None, its CPU times; returns (training step, wake the encoder).")
        .def_property_readonly("held_count", [](const PyStepSink& s) { return s.sink.held_count(); })
        .def_property_readonly("held_overflows", [](const PyStepSink& s) { return s.sink.held_overflows(); });
}
