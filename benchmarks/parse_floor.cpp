// simdjson on a trace, the floor benchmarks/parse_floor.py holds the native parse (which also
// reads the events) against, two ways:
// - parse: its DOM parser, the whole document parsed and validated into its tape (its fastest
//   complete parse: strings unescaped, numbers converted);
// - visit: its on-demand API decoding every value as a reader would (strings unescaped, integers
//   as int64, other numbers as double).
//
//     parse_floor TRACE.json REPEAT   ->   {"parse_ms": [...], "visit_ms": [...], "events": N, ...}
#include <simdjson.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

using namespace simdjson;

struct Tally {
    uint64_t sum = 0;  // folds in every value, so no read can be optimised away
};

void visit(ondemand::value value, Tally& tally) {
    switch (value.type().value()) {
        case ondemand::json_type::object:
            for (auto field : value.get_object()) {
                tally.sum += field.unescaped_key().value().size();
                visit(field.value().value(), tally);
            }
            break;
        case ondemand::json_type::array:
            for (auto element : value.get_array()) visit(element.value(), tally);
            break;
        case ondemand::json_type::number:
            if (value.get_number_type().value() == ondemand::number_type::floating_point_number) {
                tally.sum += static_cast<uint64_t>(value.get_double().value());
            } else {
                int64_t i = 0;
                uint64_t u = 0;
                if (!value.get_int64().get(i)) tally.sum += static_cast<uint64_t>(i);
                else if (!value.get_uint64().get(u)) tally.sum += u;
                else tally.sum += static_cast<uint64_t>(value.get_double().value());  // past 64 bits
            }
            break;
        case ondemand::json_type::string: tally.sum += value.get_string().value().size(); break;
        case ondemand::json_type::boolean: tally.sum += value.get_bool().value() ? 1 : 0; break;
        case ondemand::json_type::null: tally.sum += value.is_null().value() ? 1 : 0; break;
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s TRACE.json REPEAT\n", argv[0]);
        return 2;
    }
    try {
        const padded_string json = padded_string::load(argv[1]);
        const int repeat = std::atoi(argv[2]);
        dom::parser dom_parser;
        ondemand::parser parser;
        Tally tally;
        size_t events = 0;
        std::printf("{\"parse_ms\": [");
        for (int r = 0; r < repeat; ++r) {  // the whole document parsed and validated into its tape
            const auto start = std::chrono::steady_clock::now();
            const dom::element doc = dom_parser.parse(json);
            events = doc["traceEvents"].get_array().size();
            const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
            std::printf("%s%.3f", r ? ", " : "", took.count());
        }
        std::printf("], \"visit_ms\": [");
        for (int r = 0; r < repeat; ++r) {  // every value decoded on demand, as a reader would
            const auto start = std::chrono::steady_clock::now();
            ondemand::document doc = parser.iterate(json);
            for (auto field : doc.get_object()) {
                tally.sum += field.unescaped_key().value().size();
                visit(field.value().value(), tally);
            }
            const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
            std::printf("%s%.3f", r ? ", " : "", took.count());
        }
        std::printf("], \"events\": %zu, \"tally\": %llu}\n", events, static_cast<unsigned long long>(tally.sum));
    } catch (const simdjson_error& e) {
        std::fprintf(stderr, "simdjson: %s\n", e.what());
        return 1;
    }
    return 0;
}
