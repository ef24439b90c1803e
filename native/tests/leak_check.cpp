// The core with no Python in the process, so LeakSanitizer can watch all of it (.ci/sanitize;
// under CPython it cannot: the interpreter keeps much of what it allocates until exit). Converts
// each Kineto trace named on the command line (.json or .json.gz) whole and streamed, at both
// details and with one and two threads, makes its stack samples, breaks it to take the error
// paths, and drives the live tracker, sink and step encoder through a few steps. Exits non-zero
// when a result is wrong; the sanitizers exit non-zero on what they find.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "otelprof/convert.hpp"
#include "otelprof/convert_gzip.hpp"
#include "otelprof/gzip.hpp"
#include "otelprof/json.hpp"
#include "otelprof/stacks.hpp"
#include "otelprof/step_sink.hpp"
#include "otelprof/step_spans.hpp"
#include "otelprof/step_tracker.hpp"

namespace {

using namespace otelprof;

int failures = 0;

void expect(bool ok, const std::string& what) {
    if (ok) return;
    std::fprintf(stderr, "leak_check: %s\n", what.c_str());
    ++failures;
}

std::string read_file(const char* path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Options options(bool full, int64_t threads) {
    Options o;
    o.full = full;
    o.threads = threads;
    o.split_from_bytes = 1 << 16;  // the two-thread parse on every trace but the smallest
    o.parallel_from = 64;
    o.max_request_bytes = 64 * 1024;  // several requests per trace
    o.compose_resource = [](const ResourceFacts&) {
        return ComposedResource{{{"service.name", std::string("leak_check")}}, 0};
    };
    return o;
}

bool same_requests(const ConvertOutput& a, const ConvertOutput& b) {
    if (a.requests.size() != b.requests.size()) return false;
    for (size_t i = 0; i < a.requests.size(); ++i)
        if (a.requests[i].bytes() != b.requests[i].bytes()) return false;
    return true;
}

void check_trace(const char* path) {
    const std::string raw = read_file(path);
    const bool gz = raw.size() > 2 && static_cast<unsigned char>(raw[0]) == 0x1f && static_cast<unsigned char>(raw[1]) == 0x8b;
    const std::string json = gz ? gunzip(raw, uint64_t{1} << 32) : raw;
    for (const bool full : {false, true}) {
        for (const int64_t threads : {1, 2}) {
            const Options o = options(full, threads);
            const ConvertOutput whole = convert_trace(json, o);
            expect(!whole.requests.empty(), std::string(path) + ": no requests");
            if (gz) {
                const ConvertOutput streamed = convert_gzip(raw, uint64_t{1} << 32, o);
                expect(same_requests(streamed, whole), std::string(path) + ": streamed and whole requests differ");
            }
        }
    }
    // the flame graphs' samples sum to the key_averages rows' self times (stacks.hpp)
    const StackSamples samples = stack_samples(json, std::nullopt);
    __int128 cpu = 0, device = 0, self_cpu = 0, self_device = 0;
    for (const StackValue& v : samples.cpu) cpu += v.ns;
    for (const StackValue& v : samples.device) device += v.ns;
    for (const OpRow& row : convert_trace(json, options(false, 1)).ops) {
        if (row.kind == "device") self_device += row.self_device_ns;
        else self_cpu += row.self_cpu_ns;
    }
    expect(cpu == self_cpu && device == self_device, std::string(path) + ": stack samples and self times differ");
    // error paths: the text cut short (the parser unwinds mid-document), the gzip cut short
    int errors = 0;
    try {
        stack_samples(std::string_view(json).substr(0, json.size() / 2), std::nullopt);
    } catch (const TraceError&) {
        ++errors;
    }
    try {
        convert_trace(std::string_view(json).substr(0, json.size() / 2), options(false, 2));
    } catch (const TraceError&) {
        ++errors;
    }
    if (gz) {
        try {
            convert_gzip(std::string_view(raw).substr(0, raw.size() / 2), uint64_t{1} << 32, options(false, 1));
        } catch (const std::runtime_error&) {  // GzipError, or TraceError for the JSON
            ++errors;
        }
    }
    expect(errors == (gz ? 3 : 2), std::string(path) + ": a cut trace was not rejected");
}

void check_live() {
    StepTracker tracker;
    StepSink sink(1024, 8);
    int64_t now = 1'000'000;
    for (int step = 0; step < 20; ++step) {
        tracker.phase_begin(Phase::kData, now += 10);
        tracker.data_end(now += 100, true, 32, 4096);
        tracker.phase_begin(Phase::kForward, now += 10);
        tracker.phase_end(Phase::kForward, now += 500);
        tracker.phase_begin(Phase::kBackward, now += 10);
        tracker.phase_end(Phase::kBackward, now += 900);
        tracker.phase_begin(Phase::kOptimizer, now += 10, 1);
        tracker.phase_end(Phase::kOptimizer, now += 200);
    }
    tracker.finish();
    TrackerOutbox out;
    tracker.take(out);
    expect(out.closed.size() >= 19, "the tracker closed " + std::to_string(out.closed.size()) + " of 20 steps");
    for (const TrackedStep& step : out.closed) sink.add(step, "train.step", std::nullopt, std::nullopt);
    const std::vector<StepRecord> records = sink.take();
    expect(records.size() == out.closed.size(), "the sink queued another number of steps than closed");
    const StepSpanEncoder encoder({{"service.name", std::string("leak_check")}}, "0", "step|run|", 7);
    expect(!encoder.encode(records, 4096).empty(), "the step encoder wrote no request");
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) check_trace(argv[i]);
    check_live();
    if (failures) return 1;
    std::printf("leak_check: %d traces and the live path, no failures\n", argc - 1);
    return 0;
}
