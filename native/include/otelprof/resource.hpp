// The resource of a converted trace. The core does not compose it: it hands what the trace says
// of its process (ResourceFacts) to the caller's composer, otelprof/otlp/resource.py's
// compose_resource (the one composer of every resource otelprof sends), and encodes the result.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace otelprof {

struct ResourceFacts {
    std::optional<std::string_view> host_name;  // the trace's; the composer falls back to the options'
    std::optional<int64_t> rank, world_size;
    std::string_view backend;  // "": none
    const std::vector<std::string_view>* gpu_models = nullptr;
    std::string_view run_id;
};

using ResourceAttrValue = std::variant<std::string, int64_t, double, bool>;

struct ComposedResource {
    std::vector<std::pair<std::string, ResourceAttrValue>> attributes;  // in order
    int64_t values_cut = 0;  // computed values cut to the length limit (stats: values_truncated)
};

using ResourceComposer = std::function<ComposedResource(const ResourceFacts&)>;

}  // namespace otelprof
