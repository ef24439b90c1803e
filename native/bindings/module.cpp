#include <pybind11/pybind11.h>

namespace py = pybind11;

void bind_convert(py::module_& m);
void bind_gzip(py::module_& m);
void bind_tables(py::module_& m);
void bind_step_spans(py::module_& m);
void bind_step_sink(py::module_& m);
void bind_step_tracker(py::module_& m);
void bind_stacks(py::module_& m);

PYBIND11_MODULE(_native, m) {
    m.doc() = "otelprof native core: Kineto traces and live steps to OTLP spans";
    bind_convert(m);
    bind_gzip(m);  // after bind_convert: it raises TraceError
    bind_tables(m);
    bind_step_spans(m);
    bind_step_sink(m);  // before bind_step_tracker: the tracker's attach() takes a StepSink
    bind_step_tracker(m);
    bind_stacks(m);  // after bind_convert: it raises TraceError
}
