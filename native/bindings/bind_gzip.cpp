// Glue only: gzip bytes -> a bytearray inflated in place, with the GIL released while inflating.
// Without zlib at build time bind_gzip adds nothing and converter/_load.py inflates in Python.
#include <pybind11/pybind11.h>

#ifdef OTELPROF_HAVE_ZLIB
#include <new>
#include <string>

#include "otelprof/gzip.hpp"
#endif

namespace py = pybind11;

#ifdef OTELPROF_HAVE_ZLIB
namespace {

// Inflates straight into the bytearray's own storage: growing it is a realloc (mremap for
// large sizes), so the trace is never held twice. The GIL is taken only to resize.
class ByteArraySink final : public otelprof::GzipSink {
   public:
    explicit ByteArraySink(PyObject* array) : array_(array) {}
    char* resize(size_t n) override {
        py::gil_scoped_acquire gil;
        if (PyByteArray_Resize(array_, static_cast<Py_ssize_t>(n)) != 0) {
            PyErr_Clear();
            throw std::bad_alloc();
        }
        return PyByteArray_AS_STRING(array_);
    }

   private:
    PyObject* array_;
};

}  // namespace
#endif

void bind_gzip(py::module_& m) {
#ifdef OTELPROF_HAVE_ZLIB
    py::object trace_error = m.attr("TraceError");  // bind_convert registers it first
    m.def(
        "gunzip",
        [trace_error](const py::buffer& data, uint64_t limit) -> py::object {
            const py::buffer_info buf = data.request();
            if (buf.ndim > 1 || (buf.ndim == 1 && buf.strides[0] != buf.itemsize))
                throw py::type_error("gunzip() needs a contiguous bytes-like object");
            std::string_view in(static_cast<const char*>(buf.ptr), static_cast<size_t>(buf.size * buf.itemsize));
            py::object out = py::reinterpret_steal<py::object>(PyByteArray_FromStringAndSize(nullptr, 0));
            if (!out) throw py::error_already_set();
            ByteArraySink sink(out.ptr());
            std::string error;
            {
                py::gil_scoped_release release;
                try {
                    otelprof::gunzip(in, limit, sink);
                } catch (const otelprof::GzipError& e) {
                    error = e.what();
                }
            }
            if (!error.empty()) {
                PyErr_SetString(trace_error.ptr(), error.c_str());
                throw py::error_already_set();
            }
            return out;
        },
        py::arg("data"), py::arg("limit"),
        "Every gzip member of `data` inflated into one bytearray; more than `limit` bytes out, corrupt "
        "or truncated data raise TraceError. Releases the GIL.");
    m.attr("streaming_inflater") = otelprof::streaming_inflater();
#else
    (void)m;
#endif
}
