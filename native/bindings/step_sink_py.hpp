// The step sink's Python class (bind_step_sink.cpp), which the step tracker (bind_step_tracker.cpp)
// hands closed steps to.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>

#include "otelprof/step_sink.hpp"
#include "step_spans_py.hpp"

// The step metrics and span queue of steps kept native (StepSink), for
// capture/metrics/step_metrics.py and capture/spans/step_spans.py; used under the GIL only.
class PyStepSink {
  public:
    PyStepSink(size_t max_pending, size_t batch_steps) : sink(max_pending, batch_steps) {}

    // A StepSinkMetrics (named fields) of one snapshot: the state is copied before any Python
    // object is made (making one may run other Python threads).
    pybind11::object metrics() const;
    // The queued steps' spans as request bytes (the queue empties); the GIL is released to encode.
    pybind11::list encode(const PyStepSpanEncoder& encoder, size_t max_bytes);
    // A LastStep of the step queued last, or None.
    pybind11::object last() const;
    // A FoldedStep of the training step folded last, or None.
    pybind11::object folded() const;
    // The oldest held step (StepSink::held) as a tuple, or None.
    pybind11::object held() const;
    // StepSink::release: (training step, wake the encoder).
    pybind11::tuple release(const pybind11::object& end, const pybind11::object& phases);

    otelprof::StepSink sink;
};
