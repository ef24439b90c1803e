// The stack samples of a with_stack window (mirrors otelprof/capture/profiles/stacks.py
// `samples`): each key_averages event's CPU self time (negative ones taken from the events
// below) on its stack, and each kernel's, memcpy's and memset's device time under the stack that
// launched it, by ProfilerStep#N. Pure C++; the bindings build stacks.py's Samples from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "otelprof/trace.hpp"

namespace otelprof {

// A Python function (file and line from torch's "path(line): name"), else an event's name.
struct StackFrame {
    std::string name, file;
    int64_t line = 0;
};

// A stack, root first: `parent` (an earlier node, or -1 for a root frame) and its last frame.
// Distinct nodes are distinct stacks, as the reference's tuples of frames are.
struct StackNode {
    int parent;
    int frame;
};

struct StackValue {
    int stack;
    int64_t step;  // ProfilerStep#N's N, or -1: outside every step
    __int128 ns;   // exact: a sum of many long durations may pass int64
};

struct StackSamples {
    std::vector<StackFrame> frames;      // distinct by value
    std::vector<StackNode> stacks;       // parents before children
    std::vector<StackValue> cpu, device;  // distinct (stack, step), in the reference's dict order
    int64_t start_ns = 0, end_ns = 0;    // of the window's complete events (0, 0: none)
};

// The samples of Kineto JSON, read as the converter reads it (`base_time_ns` as its
// Options::base_time_ns). Throws TraceError for what the converter rejects.
StackSamples stack_samples(std::string_view json, std::optional<int64_t> base_time_ns);
StackSamples stack_samples(const Trace& trace);

}  // namespace otelprof
