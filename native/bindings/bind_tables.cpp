// Glue only: the converter's tables and naming rules, exposed for the consistency tests that
// compare them with the reference (otelprof/otlp/schema.py, otlp/names.py).
#include <optional>
#include <string>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "otelprof/names.hpp"
#include "otelprof/schema.hpp"

namespace py = pybind11;

namespace {

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

void bind_tables(py::module_& m) {
    m.def("schema", &schema, "The category and argument tables, for consistency tests.");
    m.def("category_kind", &category_kind, py::arg("category"));
    m.def("fold_kernel_name", [](const std::string& name) { return otelprof::fold_kernel_name(name); }, py::arg("name"),
          "A kernel's span name (otlp/names.py: fold_kernel_name), for consistency tests.");
    m.def("device_name", &device_name, py::arg("device_type"), py::arg("device_id"),
          "cpu, cuda:0, ... (otlp/names.py: device_name), for consistency tests.");
}
