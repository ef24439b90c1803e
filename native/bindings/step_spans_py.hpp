// What the live-step bindings share: the step span encoder's Python class (bind_step_spans.cpp),
// which the step sink (bind_step_sink.cpp) hands its queued records to.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

#include "otelprof/step_spans.hpp"

// UTF-8 of a str; lone surrogates become U+FFFD, as converter/_text.clean does.
std::string utf8(PyObject* obj);

// A step's memory (StepRecord's `memory`, the tracker's probe): None, or (allocated|None,
// reserved|None, resident|None, ooms). Throws pybind11 errors on anything else.
otelprof::StepMemory step_memory(PyObject* obj);

class PyStepSpanEncoder {
  public:
    PyStepSpanEncoder(const pybind11::list& resource, const pybind11::str& scope_version,
                      const pybind11::str& trace_prefix, uint64_t span_base);
    // StepRecord tuples (capture/spans/step_spans.py) -> request bytes.
    pybind11::list encode(const pybind11::list& steps, size_t max_bytes) const;
    // Releases the GIL while encoding.
    pybind11::list encode_records(const std::vector<otelprof::StepRecord>& records, size_t max_bytes) const;

  private:
    static std::vector<std::pair<std::string, otelprof::ResourceValue>> to_resource(const pybind11::list& resource);
    otelprof::StepSpanEncoder encoder_;
};
