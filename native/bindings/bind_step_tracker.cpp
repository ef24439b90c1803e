// The step tracker (otelprof/step_tracker.hpp) for otelprof/capture/steps/native_tracker.py's NativeStepTracker.
// The hooks torch calls several times per step are plain C functions (METH_FASTCALL, made by
// hook()): torch calls them directly, with no Python frame and no pybind11 dispatch in between.
// Nothing raises into the training loop: a failing callback (or clock) stops the tracker and is
// handed to on_error once.
#include <pybind11/pybind11.h>

#include <cstring>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "otelprof/step_tracker.hpp"
#include "step_sink_py.hpp"
#include "step_spans_py.hpp"

namespace py = pybind11;
using otelprof::Phase;

namespace {

constexpr const char* kCapsule = "otelprof.StepTracker";
constexpr size_t kMaxNames = 256;  // distinct step_scope() names kept; later ones share the last

int64_t wall_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);  // time.time_ns()
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// -1: None (unknown); a non-negative int otherwise.
int64_t size_arg(PyObject* obj, const char* what = "a batch size") {
    if (obj == Py_None) return -1;
    const long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (v < 0) throw py::value_error(std::string(what) + " must be >= 0");
    return v;
}

// Parses (trace id, span id) of capture/step_spans.current_parent(); false: malformed.
bool parent_ids(PyObject* pair, std::optional<otelprof::TraceId>& trace, std::optional<otelprof::SpanId>& span) {
    if (pair == Py_None) return true;
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) return false;
    PyObject* t = PyTuple_GET_ITEM(pair, 0);
    PyObject* s = PyTuple_GET_ITEM(pair, 1);
    if (!PyBytes_Check(t) || PyBytes_GET_SIZE(t) != 16 || !PyBytes_Check(s) || PyBytes_GET_SIZE(s) != 8) return false;
    trace.emplace();
    span.emplace();
    std::memcpy(trace->data(), PyBytes_AS_STRING(t), 16);
    std::memcpy(span->data(), PyBytes_AS_STRING(s), 8);
    return true;
}

class LiveTracker {
  public:
    LiveTracker(py::object on_step, py::object step_type, int64_t first_step, py::object clock,
                py::object on_first_open, py::object on_error, py::object grad_enabled, py::object on_hint)
        : core_(first_step),
          on_step_(std::move(on_step)),
          step_type_(std::move(step_type)),
          clock_(std::move(clock)),
          on_first_open_(std::move(on_first_open)),
          on_error_(std::move(on_error)),
          grad_enabled_(std::move(grad_enabled)),
          on_hint_(std::move(on_hint)) {
        for (const char* name : {"data", "forward", "backward", "optimizer"}) phase_names_.append(py::str(name));
        names_.push_back(py::str("train.step"));
        name_utf8_.emplace_back("train.step");
    }

    bool failed() const { return failed_; }

    // The hot path: one event, then what it left (a closed step, the first opening) delivered.
    // `key`: the optimizer's identity; an outermost forward reads grad mode (evaluation: off).
    // `module`: a forward's root module (nullptr: none), named by its slot in modules_.
    void begin(Phase phase, uint64_t key = 0, PyObject* module = nullptr) {
        if (failed_) return;
        uint32_t slot = 0;
        if (phase == Phase::kForward && module != nullptr && module != Py_None) {
            slot = module_slot(module);
            if (slot == kNoSlot) return fail_current();
        }
        begin_slot(phase, key, slot);
    }
    void begin_named(Phase phase, uint64_t key, const py::object& module) {
        begin_slot(phase, key, module.is_none() ? 0 : name_slot(py::str(module), modules_, module_utf8_));
    }
    void begin_slot(Phase phase, uint64_t key, uint32_t module) {
        if (failed_) return;
        bool grad = true;
        if (phase == Phase::kForward && !grad_enabled_.is_none() && core_.forward_is_outermost()) {
            PyObject* r = PyObject_CallNoArgs(grad_enabled_.ptr());
            const int truth = r ? PyObject_IsTrue(r) : -1;
            Py_XDECREF(r);
            if (truth < 0) return fail_current();
            grad = truth == 1;
        }
        timed([this, phase, key, grad, module](int64_t now) { core_.phase_begin(phase, now, key, grad, module); });
    }
    void end(Phase phase) {
        timed([this, phase](int64_t now) { core_.phase_end(phase, now); });
    }
    void end_update() {
        timed([this](int64_t now) { core_.update_end(now); });
    }

    // A fetch ended: with a batch (its sizes, None: unknown) or none (the iterator was exhausted).
    void data_end(bool batch, PyObject* samples, PyObject* tokens) {
        if (failed_) return;
        int64_t s = -1, t = -1;
        try {
            s = size_arg(samples);
            t = size_arg(tokens);
        } catch (py::error_already_set&) {
            PyErr_Clear();  // an odd batch: its size stays unknown, the step is still timed
            s = t = -1;
        }
        timed([this, batch, s, t](int64_t now) { core_.data_end(now, batch, s, t); });
    }

    void set_batch(py::object samples, py::object tokens) {
        const int64_t s = size_arg(samples.ptr()), t = size_arg(tokens.ptr());
        if (!failed_) core_.set_batch(s, t);
    }

    int64_t eval_forwards() { return core_.eval_forwards(); }

    // An event at the clock's time, then what it left delivered (not after a failure); the
    // clock is read again after the callbacks so that their time is no phase's (core resume()).
    template <typename Event>
    void timed(Event&& event) {
        if (failed_) return;
        int64_t now = 0;
        if (!read_clock(now)) return;
        event(now);
        if (!core_.pending() || !deliver()) return;
        int64_t after = 0;
        if (!failed_ && read_clock(after)) core_.resume(now, after);
    }

    void step(py::object number, py::object samples, py::object tokens, py::object micro_batches) {
        const int64_t n = size_arg(number.ptr(), "a step number");
        const int64_t s = size_arg(samples.ptr()), t = size_arg(tokens.ptr());
        const int64_t b = size_arg(micro_batches.ptr(), "a micro-batch count");
        timed([this, n, s, t, b](int64_t now) { core_.step(now, n, s, t, b); });
    }
    void begin_scope(const py::str& name, bool evaluation) {
        const uint32_t slot = name_slot(name, names_, name_utf8_);
        timed([this, slot, evaluation](int64_t now) { core_.begin_scope(slot, now, evaluation); });
    }
    void end_scope() {
        timed([this](int64_t now) { core_.end_scope(now); });
    }
    void finish() {
        if (failed_) return;
        core_.finish();
        if (core_.pending()) deliver();
    }

    int64_t abandon() { return core_.abandon(); }

    // A Python-side failure (a hook wrapper's): the tracker stops, logged once by on_error.
    void fail_with(py::object exc) {
        if (failed_) return;
        failed_ = true;
        if (!on_error_.is_none()) {
            PyObject* r = PyObject_CallOneArg(on_error_.ptr(), exc.ptr());
            if (r == nullptr) PyErr_Clear();  // the logger itself failed: nothing more to do
            Py_XDECREF(r);
        }
    }

    // Closed steps go to `sink` from now on (CPU-timed steps): no Python Step per step; the
    // application's current span is looked up through `context_var` (OpenTelemetry's context
    // variable: an empty context, the usual case, costs no Python call) and `parent()`;
    // `on_boundary(number, seconds)` runs per step when given; `notify()` when a batch is queued;
    // `on_held()` after a step the sink holds for its device times (StepSink::hold), last;
    // `probe()` before a training step goes to the sink: its memory (StepSink::set_memory);
    // with `probe_when` (a module's globals: torch.cuda's), only once its `_initialized` is True
    // (the CPU's resident peak the sink reads itself: no Python call per step until then).
    void attach(std::shared_ptr<PyStepSink> sink, py::object on_boundary, py::object parent, py::object context_var,
                py::object notify, py::object on_held, py::object probe, py::object probe_when) {
        if (!context_var.is_none() && !PyContextVar_CheckExact(context_var.ptr()))
            throw py::type_error("context_var must be a contextvars.ContextVar or None");
        if (!probe_when.is_none() && !PyDict_Check(probe_when.ptr()))
            throw py::type_error("probe_when must be a dict (a module's __dict__) or None");
        probe_when_ = std::move(probe_when);
        probe_due_ = probe_when_.is_none();
        sink_ = std::move(sink);
        on_boundary_ = std::move(on_boundary);
        parent_ = std::move(parent);
        context_var_ = std::move(context_var);
        notify_ = std::move(notify);
        on_held_ = std::move(on_held);
        probe_ = std::move(probe);
    }

    // After the session: the callbacks go (they refer back to the session, through objects
    // Python's collector cannot see into) and every later event is ignored.
    void release() {
        failed_ = true;
        on_step_ = on_first_open_ = on_error_ = clock_ = grad_enabled_ = on_hint_ = py::none();
        on_boundary_ = parent_ = context_var_ = notify_ = on_held_ = probe_ = probe_when_ = py::none();
        sink_.reset();
    }

  private:
    bool read_clock(int64_t& now) {
        if (clock_.is_none()) {
            now = wall_ns();
            return true;
        }
        PyObject* r = PyObject_CallNoArgs(clock_.ptr());
        if (r != nullptr) {
            now = PyLong_AsLongLong(r);
            Py_DECREF(r);
            if (!(now == -1 && PyErr_Occurred())) return true;
        }
        fail_current();
        return false;
    }

    // Hands the outbox to Python: the first opening, then each closed step as a steps.Step.
    // True when a callback ran or a step closed (StepTracker._delivered: the clock is read again).
    bool deliver() {
        otelprof::TrackerOutbox out;
        core_.take(out);
        bool called = !out.closed.empty();
        if (out.first_open && !on_first_open_.is_none()) {
            called = true;
            PyObject* n = PyLong_FromLongLong(*out.first_open);
            PyObject* r = n ? PyObject_CallOneArg(on_first_open_.ptr(), n) : nullptr;
            Py_XDECREF(n);
            if (r == nullptr || !set_window(r)) return fail_current(), false;
        }
        if (out.hint && !on_hint_.is_none()) {
            called = true;
            PyObject* n = PyLong_FromLongLong(*out.hint);
            PyObject* r = n ? PyObject_CallOneArg(on_hint_.ptr(), n) : nullptr;
            Py_XDECREF(n);
            if (r == nullptr) return fail_current(), false;
            Py_DECREF(r);
        }
        for (const otelprof::TrackedStep& s : out.closed) {
            if (sink_) {
                if (!to_sink(s)) return fail_current(), false;
                continue;
            }
            PyObject* step = make_step(s);
            PyObject* r = step ? PyObject_CallOneArg(on_step_.ptr(), step) : nullptr;
            Py_XDECREF(step);
            if (r == nullptr) return fail_current(), false;
            Py_DECREF(r);
        }
        return called;
    }

    // False with a Python error set.
    bool to_sink(const otelprof::TrackedStep& s) {
        std::optional<otelprof::TraceId> trace;
        std::optional<otelprof::SpanId> span;
        bool look = parent_.ptr() != Py_None;
        if (look && !context_var_.is_none()) {
            PyObject* ctx = nullptr;
            if (PyContextVar_Get(context_var_.ptr(), nullptr, &ctx) < 0) return false;
            const Py_ssize_t n = ctx ? PyObject_Length(ctx) : 0;
            Py_XDECREF(ctx);
            if (n < 0) return false;
            look = n > 0;  // no span, no baggage: nothing to nest under
        }
        if (look) {
            PyObject* pair = PyObject_CallNoArgs(parent_.ptr());
            if (pair == nullptr) return false;
            const bool ok = parent_ids(pair, trace, span);
            Py_DECREF(pair);
            if (!ok) {
                PyErr_SetString(PyExc_TypeError, "parent() must return (16-byte trace id, 8-byte span id) or None");
                return false;
            }
        }
        const std::shared_ptr<PyStepSink> sink = sink_;  // a callback below may release it
        if (!s.evaluation && !probe_.is_none() && probe_due() && !probe(*sink)) return false;
        const otelprof::StepAdded added =
            sink->sink.add(s, name_utf8_[s.name < name_utf8_.size() ? s.name : 0], trace, span, &module_utf8_);
        if (added.wake && !notify_.is_none()) {
            PyObject* r = PyObject_CallNoArgs(notify_.ptr());
            if (r == nullptr) return false;
            Py_DECREF(r);
        }
        if (added.boundary && !on_boundary_.is_none()) {
            PyObject* r = PyObject_CallFunction(on_boundary_.ptr(), "Ld", static_cast<long long>(s.number),
                                                static_cast<double>(s.end - s.start) / 1e9);
            if (r == nullptr || !set_window(r)) return false;
        }
        if (added.held && !on_held_.is_none()) {
            PyObject* r = PyObject_CallNoArgs(on_held_.ptr());
            if (r == nullptr) return false;
            Py_DECREF(r);
        }
        return true;
    }

    // Whether probe() runs now: always without probe_when, else once its `_initialized` is True
    // (a dict lookup; latched, as CUDA stays initialised).
    bool probe_due() {
        if (probe_due_) return true;
        PyObject* flag = PyDict_GetItemWithError(probe_when_.ptr(), initialized_.ptr());  // borrowed
        probe_due_ = flag != nullptr && PyObject_IsTrue(flag) == 1;
        PyErr_Clear();  // an odd flag reads as not initialised
        return probe_due_;
    }

    // The training step's memory, read by probe() before it is queued. False with a Python error set.
    bool probe(PyStepSink& sink) {
        PyObject* r = PyObject_CallNoArgs(probe_.ptr());
        if (r == nullptr) return false;
        const py::object memory = py::reinterpret_steal<py::object>(r);
        try {
            sink.sink.set_memory(step_memory(memory.ptr()));
        } catch (py::error_already_set& e) {
            e.restore();
            return false;
        } catch (py::builtin_exception& e) {
            e.set_error();
            return false;
        }
        return true;
    }

    // What on_first_open / on_boundary returned (stolen): the profiling-window mark of the step
    // beginning now (a str; None: none), for the sink (StepSink::set_window). False with a
    // Python error set.
    bool set_window(PyObject* r) {
        std::string window;
        if (PyUnicode_Check(r)) {
            Py_ssize_t n = 0;
            const char* data = PyUnicode_AsUTF8AndSize(r, &n);
            if (data == nullptr) {
                Py_DECREF(r);
                return false;
            }
            window.assign(data, static_cast<size_t>(n));
        }
        Py_DECREF(r);
        if (sink_) sink_->sink.set_window(std::move(window));
        return true;
    }

    // steps.Step(number, start_ns, end_ns, phases, phase_totals_ns, dropped_phases, samples,
    // tokens, name, micro_batches, evaluation, window, phase_modules, skipped)
    PyObject* make_step(const otelprof::TrackedStep& s) {
        py::list phases(s.phases.size()), modules(s.phases.size());
        size_t i = 0;
        for (const otelprof::PhaseSpan& p : s.phases) {
            py::object m = p.module && p.module < modules_.size() ? modules_[p.module] : py::none();
            PyList_SET_ITEM(modules.ptr(), static_cast<Py_ssize_t>(i), m.release().ptr());
            PyObject* t = PyTuple_New(3);
            if (t == nullptr) return nullptr;
            PyObject* name = phase_names_[static_cast<size_t>(p.phase)].ptr();
            Py_INCREF(name);
            PyTuple_SET_ITEM(t, 0, name);
            PyTuple_SET_ITEM(t, 1, PyLong_FromLongLong(p.start));
            PyTuple_SET_ITEM(t, 2, PyLong_FromLongLong(p.end));
            PyList_SET_ITEM(phases.ptr(), static_cast<Py_ssize_t>(i++), t);
        }
        py::dict totals;
        for (int k = 0; k < otelprof::kPhaseCount; ++k) {
            if (s.with_total & (1u << k)) totals[phase_names_[static_cast<size_t>(k)]] = py::int_(s.totals[k]);
        }
        py::object args[14] = {
            py::int_(s.number),
            py::int_(s.start),
            py::int_(s.end),
            std::move(phases),
            std::move(totals),
            py::int_(s.dropped_phases),
            s.samples ? py::object(py::int_(*s.samples)) : py::none(),
            s.tokens ? py::object(py::int_(*s.tokens)) : py::none(),
            names_[s.name < names_.size() ? s.name : 0],
            py::int_(s.micro_batches),
            py::bool_(s.evaluation),
            py::none(),  // window: the session sets it
            std::move(modules),
            py::bool_(s.skipped),
        };
        PyObject* argv[14];
        for (int k = 0; k < 14; ++k) argv[k] = args[k].ptr();
        return PyObject_Vectorcall(step_type_.ptr(), argv, 14, nullptr);
    }

    // The Python error now set stops the tracker (handed to on_error, then cleared).
    void fail_current() {
        PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (value != nullptr && tb != nullptr) PyException_SetTraceback(value, tb);
        py::object exc = value ? py::reinterpret_steal<py::object>(value) : py::none();
        Py_XDECREF(type);
        Py_XDECREF(tb);
        fail_with(exc);
    }

    static uint32_t name_slot(const py::str& name, std::vector<py::object>& names, std::vector<std::string>& utf) {
        for (size_t k = 0; k < names.size(); ++k) {
            if (names[k].equal(name)) return static_cast<uint32_t>(k);
        }
        if (names.size() >= kMaxNames) return static_cast<uint32_t>(kMaxNames - 1);
        names.push_back(name);
        utf.push_back(utf8(name.ptr()));
        return static_cast<uint32_t>(names.size() - 1);
    }

    static constexpr uint32_t kNoSlot = UINT32_MAX;
    static constexpr uint32_t kUnwrap = UINT32_MAX - 1;  // an OptimizedModule: its _orig_mod's

    // steps.module_name(module)'s slot, cached per type (a forward costs a scan of a few
    // pointers); kNoSlot with a Python error set.
    uint32_t module_slot(PyObject* module) {
        PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(module));
        uint32_t slot = kNoSlot;
        for (const auto& [t, s] : module_types_) {
            if (t.ptr() == type) slot = s;
        }
        if (slot == kNoSlot) {
            PyObject* name = PyObject_GetAttrString(type, "__name__");
            if (name == nullptr) return kNoSlot;
            py::str str = py::reinterpret_steal<py::str>(name);
            slot = str.equal(py::str("OptimizedModule")) ? kUnwrap : name_slot(str, modules_, module_utf8_);
            if (module_types_.size() < kMaxNames) module_types_.emplace_back(py::reinterpret_borrow<py::object>(type), slot);
        }
        if (slot != kUnwrap) return slot;
        PyObject* inner = PyObject_GetAttrString(module, "_orig_mod");
        if (inner == nullptr) {
            PyErr_Clear();  // not torch's: its own name
            return name_slot(py::str("OptimizedModule"), modules_, module_utf8_);
        }
        const uint32_t s = Py_TYPE(inner) == Py_TYPE(module) ? 0 : module_slot(inner);
        Py_DECREF(inner);
        return s;
    }

    otelprof::StepTracker core_;
    py::object on_step_, step_type_, clock_, on_first_open_, on_error_, grad_enabled_, on_hint_;
    py::list phase_names_;
    std::vector<py::object> names_;  // slot 0: the default name
    std::vector<std::string> name_utf8_;  // the same, as spans carry them
    bool failed_ = false;
    std::shared_ptr<PyStepSink> sink_;
    py::object on_held_ = py::none();
    py::object on_boundary_, parent_, context_var_, notify_;
    py::object probe_ = py::none(), probe_when_ = py::none();
    py::str initialized_{"_initialized"};
    bool probe_due_ = true;
    std::vector<py::object> modules_{py::none()};  // forward phases' module names; slot 0: none
    std::vector<std::string> module_utf8_{std::string()};
    std::vector<std::pair<py::object, uint32_t>> module_types_;  // type -> slot (or kUnwrap)
};

using Holder = std::shared_ptr<LiveTracker>;

py::object out_of_memory() {
    PyObject* exc = PyObject_CallOneArg(PyExc_MemoryError, py::str("otelprof step tracker").ptr());
    if (exc == nullptr) PyErr_Clear();
    return exc ? py::reinterpret_steal<py::object>(exc) : py::none();
}

LiveTracker* from_capsule(PyObject* self) {
    auto* holder = static_cast<Holder*>(PyCapsule_GetPointer(self, kCapsule));
    return holder ? holder->get() : nullptr;
}

// Each hook ignores its arguments (a module and its input, an optimizer and its args...) and
// returns None, as torch's hooks must to leave what they observe unchanged.
// The optimizer hooks' first argument is the optimizer: its identity tells optimizers apart.
template <bool Begin, Phase P>
PyObject* phase_hook(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    LiveTracker* t = from_capsule(self);
    if (t == nullptr) return nullptr;
    try {
        if (Begin) {
            const bool keyed = P == Phase::kOptimizer && nargs > 0 && args[0] != Py_None;
            t->begin(P, keyed ? static_cast<uint64_t>(reinterpret_cast<uintptr_t>(args[0])) : 0,
                     P == Phase::kForward && nargs > 0 ? args[0] : nullptr);
        } else {
            t->end(P);
        }
    } catch (...) {  // std::bad_alloc: the tracker stops, the loop goes on
        t->fail_with(out_of_memory());
    }
    Py_RETURN_NONE;
}

// GradScaler.step returned (the hooks opened its optimizer phase with begin_optimizer).
PyObject* update_end_hook(PyObject* self, PyObject* const*, Py_ssize_t) {
    LiveTracker* t = from_capsule(self);
    if (t == nullptr) return nullptr;
    try {
        t->end_update();
    } catch (...) {
        t->fail_with(out_of_memory());
    }
    Py_RETURN_NONE;
}

template <bool Batch>
PyObject* data_end_hook(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    LiveTracker* t = from_capsule(self);
    if (t == nullptr) return nullptr;
    try {
        t->data_end(Batch, Batch && nargs > 0 ? args[0] : Py_None, Batch && nargs > 1 ? args[1] : Py_None);
    } catch (...) {
        t->fail_with(out_of_memory());
    }
    Py_RETURN_NONE;
}

PyMethodDef kHooks[] = {
    {"begin_data", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&phase_hook<true, Phase::kData>)),
     METH_FASTCALL, "A DataLoader fetch begins."},
    {"end_data", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&data_end_hook<false>)),
     METH_FASTCALL, "A DataLoader fetch ended with no batch (the iterator was exhausted)."},
    {"data_end", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&data_end_hook<true>)), METH_FASTCALL,
     "data_end(samples, tokens): a fetch ended with a batch of that size (None: unknown)."},
    {"begin_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&phase_hook<true, Phase::kForward>)),
     METH_FASTCALL, "A root module's forward pre-hook."},
    {"end_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&phase_hook<false, Phase::kForward>)),
     METH_FASTCALL, "A root module's forward hook."},
    {"begin_backward",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&phase_hook<true, Phase::kBackward>)), METH_FASTCALL,
     "torch.autograd.backward begins."},
    {"end_backward",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&phase_hook<false, Phase::kBackward>)), METH_FASTCALL,
     "torch.autograd.backward returned."},
    {"begin_optimizer",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&phase_hook<true, Phase::kOptimizer>)), METH_FASTCALL,
     "The global optimizer step pre-hook."},
    {"end_optimizer",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&phase_hook<false, Phase::kOptimizer>)),
     METH_FASTCALL, "The global optimizer step post-hook."},
    {"end_update", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&update_end_hook)), METH_FASTCALL,
     "A gradient scaler's step returned: the end of its optimizer phase (skipped when no optimizer stepped)."},
    {nullptr, nullptr, 0, nullptr},
};

Phase phase_of(const std::string& name) {
    if (name == "data") return Phase::kData;
    if (name == "forward") return Phase::kForward;
    if (name == "backward") return Phase::kBackward;
    if (name == "optimizer") return Phase::kOptimizer;
    throw py::value_error("unknown phase: " + name);
}

}  // namespace

void bind_step_tracker(py::module_& m) {
    py::class_<LiveTracker, Holder>(m, "StepTracker")
        .def(py::init<py::object, py::object, int64_t, py::object, py::object, py::object, py::object, py::object>(),
             py::arg("on_step"), py::arg("step_type"), py::arg("first_step") = 0, py::arg("clock") = py::none(),
             py::arg("on_first_open") = py::none(), py::arg("on_error") = py::none(),
             py::arg("grad_enabled") = py::none(), py::arg("on_hint") = py::none())
        .def_property_readonly("failed", &LiveTracker::failed)
        .def_property_readonly("eval_forwards", &LiveTracker::eval_forwards)
        .def(
            "phase_begin",
            [](LiveTracker& t, const std::string& phase, uint64_t key, py::object module) {
                t.begin_named(phase_of(phase), key, module);
            },
            py::arg("phase"), py::arg("key") = 0, py::arg("module") = py::none())
        .def("phase_end", [](LiveTracker& t, const std::string& phase) { t.end(phase_of(phase)); })
        .def("set_batch", &LiveTracker::set_batch, py::arg("samples") = py::none(), py::arg("tokens") = py::none())
        .def("step", &LiveTracker::step, py::arg("number") = py::none(), py::arg("samples") = py::none(),
             py::arg("tokens") = py::none(), py::arg("micro_batches") = py::none())
        .def("begin_scope", &LiveTracker::begin_scope, py::arg("name"), py::arg("evaluation") = false)
        .def("end_scope", &LiveTracker::end_scope)
        .def("finish", &LiveTracker::finish)
        .def("abandon", &LiveTracker::abandon,
             "Drops the open step whose span an error made elsewhere; returns the number it takes.")
        .def("fail", &LiveTracker::fail_with)
        .def("release", &LiveTracker::release)
        .def("attach", &LiveTracker::attach, py::arg("sink"), py::arg("on_boundary") = py::none(),
             py::arg("parent") = py::none(), py::arg("context_var") = py::none(), py::arg("notify") = py::none(),
             py::arg("on_held") = py::none(), py::arg("probe") = py::none(), py::arg("probe_when") = py::none())
        .def(
            "hook",
            [](const Holder& self, const std::string& name) {
                for (PyMethodDef* def = kHooks; def->ml_name != nullptr; ++def) {
                    if (name != def->ml_name) continue;
                    PyObject* capsule = PyCapsule_New(new Holder(self), kCapsule, [](PyObject* c) {
                        delete static_cast<Holder*>(PyCapsule_GetPointer(c, kCapsule));
                    });
                    if (capsule == nullptr) throw py::error_already_set();
                    PyObject* fn = PyCFunction_New(def, capsule);
                    Py_DECREF(capsule);
                    if (fn == nullptr) throw py::error_already_set();
                    return py::reinterpret_steal<py::object>(fn);
                }
                throw py::value_error("unknown hook: " + name);
            },
            "A C function for torch to call as hook ``name`` (begin_forward, end_optimizer, data_end...).");
}
