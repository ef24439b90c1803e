// The stack samples of a with_stack window (mirrors otelprof/capture/profiles/stacks.py
// `samples`, which is its specification and test oracle): the converter's reader and event tree
// (tree.cpp: nesting, device work under its launch), then the key_averages tree over them as
// stacks.py walks it. Sums are 128-bit where Python's integers are unbounded.
#include "otelprof/stacks.hpp"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "otelprof/json.hpp"
#include "otelprof/schema.hpp"
#include "otelprof/tree.hpp"

namespace otelprof {

namespace {

constexpr std::string_view kUnattributed = "[device work without a launch]";  // stacks.UNATTRIBUTED
constexpr std::string_view kStepFrame = "ProfilerStep*";  // every step's frame, as key_averages names it

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// A python_function's frame: "path(line): name" split at the last "(digits): " (stacks.py's
// _PYTHON_FRAME, whose greedy path takes the last), else the name without the object address
// of "<built-in method ... at 0x7f...>" (_ADDRESS), which differs by call and run.
StackFrame python_frame(std::string_view name) {
    size_t p = name.size();
    while (p > 0 && (p = name.rfind('(', p - 1)) != std::string_view::npos) {
        size_t q = p + 1;
        while (q < name.size() && name[q] >= '0' && name[q] <= '9') ++q;
        if (q - p - 1 >= 1 && q - p - 1 <= 18 && name.substr(q, 3) == "): ") {
            int64_t line = 0;
            for (size_t k = p + 1; k < q; ++k) line = line * 10 + (name[k] - '0');
            return {std::string(name.substr(q + 3)), std::string(name.substr(0, p)), line};
        }
    }
    if (!name.empty() && name.back() == '>') {
        size_t k = name.size() - 1;  // the hex digits before the '>' start at k
        while (k > 0 && is_hex(name[k - 1])) --k;
        if (k < name.size() - 1 && k >= 6 && name.substr(k - 6, 6) == " at 0x")
            return {std::string(name.substr(0, k - 6)) + ">", {}, 0};
    }
    return {std::string(name), {}, 0};
}

// Frames and stacks, each interned by value, and the (stack, step) sums in first-seen order.
class Interner {
  public:
    explicit Interner(StackSamples& out) : out_(out) {}

    int frame(StackFrame f) {
        key_.assign(reinterpret_cast<const char*>(&f.line), sizeof f.line);
        const size_t file_len = f.file.size();
        key_.append(reinterpret_cast<const char*>(&file_len), sizeof file_len).append(f.file).append(f.name);
        auto [it, inserted] = frames_.try_emplace(key_, static_cast<int>(out_.frames.size()));
        if (inserted) out_.frames.push_back(std::move(f));
        return it->second;
    }

    int stack(int parent, int frame) {
        const uint64_t key = uint64_t{static_cast<uint32_t>(parent + 1)} << 32 | static_cast<uint32_t>(frame);
        auto [it, inserted] = stacks_.try_emplace(key, static_cast<int>(out_.stacks.size()));
        if (inserted) out_.stacks.push_back(StackNode{parent, frame});
        return it->second;
    }

    void add_cpu(int stack, int64_t step, __int128 ns) { add(out_.cpu, cpu_, stack, step, ns); }
    void add_device(int stack, int64_t step, __int128 ns) { add(out_.device, device_, stack, step, ns); }

  private:
    struct PairHash {
        size_t operator()(const std::pair<int, int64_t>& k) const {
            return static_cast<size_t>((static_cast<uint64_t>(k.first) * 0x9E3779B97F4A7C15ULL) ^
                                       (static_cast<uint64_t>(k.second) + 0x632BE59BD9B4E019ULL));
        }
    };
    using Sums = std::unordered_map<std::pair<int, int64_t>, size_t, PairHash>;

    static void add(std::vector<StackValue>& values, Sums& at, int stack, int64_t step, __int128 ns) {
        auto [it, inserted] = at.try_emplace(std::make_pair(stack, step), values.size());
        if (inserted) values.push_back(StackValue{stack, step, 0});
        values[it->second].ns += ns;
    }

    StackSamples& out_;
    std::string key_;
    std::unordered_map<std::string, int> frames_;
    std::unordered_map<uint64_t, int> stacks_;
    Sums cpu_, device_;
};

// stacks.py's non_negative over `own` (each key_averages event's dur - its children's): every
// negative one made 0 and taken from the events below it, deepest first, latest child first.
void non_negative(const std::vector<Event>& ev, const std::vector<char>& in_a, const std::vector<int>& a_parent,
                  std::vector<__int128>& own) {
    const int n = static_cast<int>(ev.size());
    if (std::none_of(own.begin(), own.end(), [](__int128 v) { return v < 0; })) return;
    std::vector<int> order;
    for (int i = 0; i < n; ++i)
        if (in_a[i]) order.push_back(i);
    auto nesting_key = [&](int i) { return std::make_tuple(ev[i].start, -ev[i].end, ev[i].ordinal); };
    std::sort(order.begin(), order.end(), [&](int a, int b) { return nesting_key(a) < nesting_key(b); });
    // children in that order, as offsets into one array
    std::vector<int> first(static_cast<size_t>(n) + 1, 0), depth(n, 0);
    for (int i : order)
        if (a_parent[i] >= 0) ++first[a_parent[i] + 1];
    for (int i = 0; i < n; ++i) first[i + 1] += first[i];
    std::vector<int> children(static_cast<size_t>(first[n])), filled(first.begin(), first.end() - 1);
    for (int i : order) {
        const int p = a_parent[i];
        if (p >= 0) {
            children[filled[p]++] = i;
            depth[i] = depth[p] + 1;
        }
    }
    std::vector<int> negative;
    for (int i = 0; i < n; ++i)
        if (own[i] < 0) negative.push_back(i);
    std::stable_sort(negative.begin(), negative.end(), [&](int a, int b) { return depth[a] > depth[b]; });
    std::vector<int> todo;
    for (int i : negative) {
        __int128 owed = -own[i];
        own[i] = 0;
        todo.assign(children.begin() + first[i], children.begin() + first[i + 1]);
        while (owed && !todo.empty()) {
            const int j = todo.back();
            todo.pop_back();
            const __int128 take = std::min(owed, std::max(own[j], static_cast<__int128>(0)));
            own[j] -= take;
            owed -= take;
            todo.insert(todo.end(), children.begin() + first[j], children.begin() + first[j + 1]);
        }
        if (owed) throw std::logic_error("stack_samples: a subtree's self times do not sum to its duration");
    }
}

// Each event's step (stacks.py's _step_owner): its ProfilerStep#N ancestor in the key_averages
// tree, else the step running on any thread when its outermost ancestor began.
class StepOf {
  public:
    StepOf(const Trace& trace, const std::vector<int>& a_parent) : trace_(trace), a_parent_(a_parent) {
        const std::vector<Event>& ev = trace.events;
        for (const Event& e : ev) {
            const int64_t num = trace.names[e.name_id].step;
            if (!e.device() && num >= 0) marks_.push_back({e.start, e.end, num});
        }
        std::sort(marks_.begin(), marks_.end());
        memo_.assign(ev.size(), kUnknown);
    }

    // -1: none. `i` is in the key_averages tree.
    int64_t operator()(int i) {
        chain_.clear();
        int64_t step = -1;
        for (int j = i;;) {
            if (memo_[j] != kUnknown) {
                step = memo_[j];
                break;
            }
            chain_.push_back(j);
            const int64_t num = trace_.names[trace_.events[j].name_id].step;
            if (num >= 0) {
                step = num;
                break;
            }
            if (a_parent_[j] < 0) {
                step = at(trace_.events[j].start);
                break;
            }
            j = a_parent_[j];
        }
        for (int c : chain_) memo_[c] = step;
        return step;
    }

  private:
    static constexpr int64_t kUnknown = -2;
    const Trace& trace_;
    const std::vector<int>& a_parent_;
    struct Mark {
        int64_t start, end, num;
        bool operator<(const Mark& o) const { return std::tie(start, end, num) < std::tie(o.start, o.end, o.num); }
    };
    std::vector<Mark> marks_;  // every ProfilerStep#N on the CPU side, sorted
    std::vector<int64_t> memo_;
    std::vector<int> chain_;

    int64_t at(int64_t t) const {
        auto later = [](int64_t v, const Mark& m) { return v < m.start; };
        auto it = std::upper_bound(marks_.begin(), marks_.end(), t, later);
        if (it == marks_.begin()) return -1;
        --it;
        return t < it->end ? it->num : -1;
    }
};

}  // namespace

StackSamples stack_samples(const Trace& trace) {
    const std::vector<Event>& ev = trace.events;
    const std::vector<Name>& names = trace.names;
    const int n = static_cast<int>(ev.size());
    StackSamples out;
    const std::vector<int> parent = build_tree(trace).parent;
    // the key_averages tree (aggregates.cpp's self_times), each event's own time dur - children's
    std::vector<char> in_a(n, 0);
    std::vector<int> a_parent(n, -1);
    std::vector<__int128> own(n, 0);
    for (int i = 0; i < n; ++i)
        in_a[i] = !ev[i].device() && in_aggregate_kinds(ev[i].kind) && !names[ev[i].name_id].filtered;
    for (int i = 0; i < n; ++i) {
        if (!in_a[i]) continue;
        int p = parent[i];
        while (p >= 0 && !in_a[p]) p = parent[p];
        a_parent[i] = p;
        own[i] += ev[i].dur();
        if (p >= 0) own[p] -= ev[i].dur();
    }
    non_negative(ev, in_a, a_parent, own);

    Interner interner(out);
    // each name's frame, worked out once: as a python_function, as another CPU event, as device work
    std::vector<int> python_frames(names.size(), -1), cpu_frames(names.size(), -1), device_frames(names.size(), -1);
    auto frame_of = [&](const Event& e) {
        if (e.kind == Kind::Python) {
            int& f = python_frames[e.name_id];
            if (f < 0) f = interner.frame(python_frame(names[e.name_id].text));
            return f;
        }
        int& f = cpu_frames[e.name_id];
        const Name& name = names[e.name_id];
        if (f < 0) f = interner.frame({std::string(name.step >= 0 ? kStepFrame : name.text), {}, 0});
        return f;
    };
    std::vector<int> sid(n, -1), chain;
    auto stack_of = [&](int i) {  // its key_averages ancestors and itself, interned from the root down
        chain.clear();
        int j = i;
        for (; j >= 0 && sid[j] < 0; j = a_parent[j]) chain.push_back(j);
        int above = j >= 0 ? sid[j] : -1;
        for (auto it = chain.rbegin(); it != chain.rend(); ++it)
            above = sid[*it] = interner.stack(above, frame_of(ev[*it]));
        return sid[i];
    };
    StepOf step_of(trace, a_parent);
    int unattributed = -1;
    for (int i = 0; i < n; ++i) {
        const Event& e = ev[i];
        if (in_a[i]) {
            interner.add_cpu(stack_of(i), step_of(i), own[i]);
        } else if (is_device_time(e.kind)) {
            // the event whose self device time it is (stacks.py's _device_owner), or -1
            int o = parent[i];
            while (o >= 0 && !in_a[o]) o = parent[o];
            const int first_a = o;
            while (o >= 0 && ev[o].kind == Kind::Runtime) o = a_parent[o];
            if (o < 0) o = first_a;
            int above;
            if (o >= 0) {
                above = stack_of(o);
            } else {
                if (unattributed < 0)
                    unattributed = interner.stack(-1, interner.frame({std::string(kUnattributed), {}, 0}));
                above = unattributed;
            }
            int& leaf = device_frames[e.name_id];
            if (leaf < 0) leaf = interner.frame({std::string(names[e.name_id].text), {}, 0});
            interner.add_device(interner.stack(above, leaf), o >= 0 ? step_of(o) : -1, e.dur());
        }
    }
    if (n > 0) {
        out.start_ns = ev[0].start;
        out.end_ns = ev[0].end;
        for (const Event& e : ev) {
            out.start_ns = std::min(out.start_ns, e.start);
            out.end_ns = std::max(out.end_ns, e.end);
        }
    }
    return out;
}

StackSamples stack_samples(std::string_view json, std::optional<int64_t> base_time_ns) {
    Trace trace;
    {  // the document goes before the pass
        auto reader = std::make_unique<TraceReader>(base_time_ns, json.size());
        auto doc = std::make_unique<Document>(json, reader.get());
        trace = reader->finish(doc, json);
    }
    return stack_samples(trace);
}

}  // namespace otelprof
