// The step tracker (otelprof/step_tracker.hpp) for otelprof/capture/steps.py's NativeStepTracker.
// The hooks torch calls several times per step are plain C functions (METH_FASTCALL, made by
// hook()): torch calls them directly, with no Python frame and no pybind11 dispatch in between.
// Nothing raises into the training loop: a failing callback (or clock) stops the tracker and is
// handed to on_error once.
#include <pybind11/pybind11.h>

#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "otelprof/step_tracker.hpp"

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
int64_t size_arg(PyObject* obj) {
    if (obj == Py_None) return -1;
    const long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (v < 0) throw py::value_error("a batch size must be >= 0");
    return v;
}

class LiveTracker {
  public:
    LiveTracker(py::object on_step, py::object step_type, int64_t first_step, py::object clock,
                py::object on_first_open, py::object on_error)
        : core_(first_step),
          on_step_(std::move(on_step)),
          step_type_(std::move(step_type)),
          clock_(std::move(clock)),
          on_first_open_(std::move(on_first_open)),
          on_error_(std::move(on_error)) {
        for (const char* name : {"data", "forward", "backward", "optimizer"}) phase_names_.append(py::str(name));
        names_.push_back(py::str("train.step"));
    }

    bool failed() const { return failed_; }

    // The hot path: one event, then what it left (a closed step, the first opening) delivered.
    void begin(Phase phase) {
        if (failed_) return;
        int64_t now = 0;
        if (!read_clock(now)) return;
        core_.phase_begin(phase, now);
        if (core_.pending()) deliver();
    }

    void end(Phase phase) {
        if (failed_) return;
        int64_t now = 0;
        if (!read_clock(now)) return;
        core_.phase_end(phase, now);
        if (core_.pending()) deliver();
    }

    void data_end(PyObject* samples, PyObject* tokens) {
        if (failed_) return;
        int64_t s = -1, t = -1;
        try {
            s = size_arg(samples);
            t = size_arg(tokens);
        } catch (py::error_already_set&) {
            PyErr_Clear();  // an odd batch: its size stays unknown, the step is still timed
            s = t = -1;
        }
        int64_t now = 0;
        if (!read_clock(now)) return;
        core_.data_end(now, s, t);
        if (core_.pending()) deliver();
    }

    void set_batch(py::object samples, py::object tokens) {
        core_.set_batch(size_arg(samples.ptr()), size_arg(tokens.ptr()));
    }

    template <typename Event>
    void timed(Event&& event) {
        if (failed_) return;
        int64_t now = 0;
        if (!read_clock(now)) return;
        event(now);
        if (core_.pending()) deliver();
    }

    void step() {
        timed([this](int64_t now) { core_.step(now); });
    }
    void begin_scope(const py::str& name) {
        const uint32_t slot = name_slot(name);
        timed([this, slot](int64_t now) { core_.begin_scope(slot, now); });
    }
    void end_scope() {
        timed([this](int64_t now) { core_.end_scope(now); });
    }
    void finish() {
        timed([this](int64_t now) { core_.finish(now); });
    }

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

    // After the session: the callbacks go (they refer back to the session, through objects
    // Python's collector cannot see into) and every later event is ignored.
    void release() {
        failed_ = true;
        on_step_ = on_first_open_ = on_error_ = clock_ = py::none();
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
    void deliver() {
        otelprof::TrackerOutbox out;
        core_.take(out);
        if (out.first_open && !on_first_open_.is_none()) {
            PyObject* n = PyLong_FromLongLong(*out.first_open);
            PyObject* r = n ? PyObject_CallOneArg(on_first_open_.ptr(), n) : nullptr;
            Py_XDECREF(n);
            if (r == nullptr) return fail_current();
            Py_DECREF(r);
        }
        for (const otelprof::TrackedStep& s : out.closed) {
            PyObject* step = make_step(s);
            PyObject* r = step ? PyObject_CallOneArg(on_step_.ptr(), step) : nullptr;
            Py_XDECREF(step);
            if (r == nullptr) return fail_current();
            Py_DECREF(r);
        }
    }

    // steps.Step(number, start_ns, end_ns, phases, phase_totals_ns, dropped_phases, samples,
    // tokens, name)
    PyObject* make_step(const otelprof::TrackedStep& s) {
        py::list phases(s.phases.size());
        size_t i = 0;
        for (const otelprof::PhaseSpan& p : s.phases) {
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
        py::object args[9] = {
            py::int_(s.number),
            py::int_(s.start),
            py::int_(s.end),
            std::move(phases),
            std::move(totals),
            py::int_(s.dropped_phases),
            s.samples ? py::object(py::int_(*s.samples)) : py::none(),
            s.tokens ? py::object(py::int_(*s.tokens)) : py::none(),
            names_[s.name < names_.size() ? s.name : 0],
        };
        PyObject* argv[9];
        for (int k = 0; k < 9; ++k) argv[k] = args[k].ptr();
        return PyObject_Vectorcall(step_type_.ptr(), argv, 9, nullptr);
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

    uint32_t name_slot(const py::str& name) {
        for (size_t k = 0; k < names_.size(); ++k) {
            if (names_[k].equal(name)) return static_cast<uint32_t>(k);
        }
        if (names_.size() >= kMaxNames) return static_cast<uint32_t>(kMaxNames - 1);
        names_.push_back(name);
        return static_cast<uint32_t>(names_.size() - 1);
    }

    otelprof::StepTracker core_;
    py::object on_step_, step_type_, clock_, on_first_open_, on_error_;
    py::list phase_names_;
    std::vector<py::object> names_;  // slot 0: the default name
    bool failed_ = false;
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
template <bool Begin, Phase P>
PyObject* phase_hook(PyObject* self, PyObject* const*, Py_ssize_t) {
    LiveTracker* t = from_capsule(self);
    if (t == nullptr) return nullptr;
    try {
        if (Begin) {
            t->begin(P);
        } else {
            t->end(P);
        }
    } catch (...) {  // std::bad_alloc: the tracker stops, the loop goes on
        t->fail_with(out_of_memory());
    }
    Py_RETURN_NONE;
}

PyObject* data_end_hook(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    LiveTracker* t = from_capsule(self);
    if (t == nullptr) return nullptr;
    try {
        t->data_end(nargs > 0 ? args[0] : Py_None, nargs > 1 ? args[1] : Py_None);
    } catch (...) {
        t->fail_with(out_of_memory());
    }
    Py_RETURN_NONE;
}

PyMethodDef kHooks[] = {
    {"begin_data", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&phase_hook<true, Phase::kData>)),
     METH_FASTCALL, "A DataLoader fetch begins."},
    {"end_data", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&phase_hook<false, Phase::kData>)),
     METH_FASTCALL, "A DataLoader fetch ended (no batch)."},
    {"data_end", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&data_end_hook)), METH_FASTCALL,
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
        .def(py::init<py::object, py::object, int64_t, py::object, py::object, py::object>(), py::arg("on_step"),
             py::arg("step_type"), py::arg("first_step") = 0, py::arg("clock") = py::none(),
             py::arg("on_first_open") = py::none(), py::arg("on_error") = py::none())
        .def_property_readonly("failed", &LiveTracker::failed)
        .def("phase_begin", [](LiveTracker& t, const std::string& phase) { t.begin(phase_of(phase)); })
        .def("phase_end", [](LiveTracker& t, const std::string& phase) { t.end(phase_of(phase)); })
        .def("set_batch", &LiveTracker::set_batch, py::arg("samples") = py::none(), py::arg("tokens") = py::none())
        .def("step", &LiveTracker::step)
        .def("begin_scope", &LiveTracker::begin_scope)
        .def("end_scope", &LiveTracker::end_scope)
        .def("finish", &LiveTracker::finish)
        .def("fail", &LiveTracker::fail_with)
        .def("release", &LiveTracker::release)
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
