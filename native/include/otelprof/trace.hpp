// Kineto Chrome-trace events after validation (mirrors otelprof/converter/reference/reader.py).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "otelprof/attrs.hpp"
#include "otelprof/json.hpp"
#include "otelprof/schema.hpp"

namespace otelprof {

// pid / tid / flow id: an integer, or an interned string (canonical decimal strings become ints).
struct Ident {
    bool is_str = true;
    int64_t value = 0;
    bool operator==(const Ident& o) const { return is_str == o.is_str && value == o.value; }
};

// A distinct name of complete events, with what the builder asks of names (worked out once per
// name, where the name's text is at hand, instead of once per event).
struct Name {
    std::string_view text;
    int64_t step = -1;      // N of a "ProfilerStep#N", or -1
    bool filtered = false;  // is_filtered_name
    uint32_t row = 0;       // the name its op row goes by: itself, or "ProfilerStep*" for any step
};

// What an event's args say, digested as the event is read (so that the document need not be
// kept): the ids the event tree and links match on, and the attributes its span gets.
enum ArgFlag : uint8_t {
    kHasLinkId = 1,       // link_id is an integer
    kHasSequence = 2,     // a "Sequence number" member, of any type
    kSequenceInt = 4,     // ... and an integer: seq
    kFwdThreadOther = 8,  // a "Fwd thread id" that is not an integer
    kFwdThreadSet = 16,   // a "Fwd thread id" that is a non-zero integer
};

struct Event {
    int64_t start = 0;
    int64_t end = 0;
    uint32_t ordinal = 0;
    uint32_t name_id = 0;  // in Trace::names; equal names, equal ids
    Kind kind = Kind::Other;
    uint8_t arg_flags = 0;  // ArgFlag
    std::string_view cat;
    Ident pid, tid;
    // "External id" of (GPU) annotations, "correlation" of the others (runtime calls and device work)
    int64_t link_id = 0;
    int64_t seq = 0;  // "Sequence number"
    AttrRange args;   // in Trace::args: the span attributes of its args (reference: _arg_attributes)
    int64_t dur() const { return end - start; }
    bool device() const { return is_device(kind); }
    bool has(ArgFlag f) const { return arg_flags & f; }
};

// A "[memory]" instant event: its args that are integers (the reference reads no others).
struct Instant {
    uint32_t ordinal;
    uint8_t memory_present;  // bit a: memory[a] holds kMemoryAttributes[a]'s integer
    Ident pid, tid;
    int64_t ts;
    int64_t memory[kMemoryAttributeCount];
    // kMemoryAttributes[a]'s integer into `v`, or false
    bool memory_int(int a, int64_t& v) const {
        v = memory[a];
        return (memory_present >> a & 1) != 0;
    }
};

struct Flow {
    uint32_t ordinal;
    bool fwdbwd;
    char ph;
    Ident id, pid, tid;
    int64_t ts;
};

struct Trace {
    std::vector<Event> events;
    Attrs args;                        // every event's arg attributes, range by range (Event::args)
    std::deque<std::string> strings;   // the text of names, other categories, metadata and args
    std::vector<Name> names;
    std::vector<Instant> memory;
    std::vector<Flow> flows;
    // (ordinal, "Record function id") of the complete events with an integer one (what
    // Options::op_attributes joins on; reference: the args' "Record function id")
    std::vector<std::pair<uint32_t, int64_t>> record_ids;
    uint32_t total = 0;
    int64_t metadata_events = 0;
    int64_t ignored_events = 0;
    int64_t base_ns = 0;
    std::optional<int64_t> rank, world_size;
    std::string backend;
    std::vector<std::string_view> gpu_models;
    std::optional<std::string_view> trace_id;
    std::string_view trace_name;
    std::optional<std::string_view> host_name;
    std::vector<std::string_view> ident_texts;  // a string pid/tid/id's text, by its Ident::value
    std::string_view name(const Event& e) const { return names[e.name_id].text; }
};

// Exact round_half_away(value * 1000) of a JSON number of Kineto microseconds (mirrors
// reference/jsonload.py micros_to_ns); errors name traceEvents[ordinal].field.
int64_t micros_to_ns(const JNode& n, const char* field, uint32_t ordinal);

// Reads the events of a trace, as a Document's sink while it is parsed (convert_trace), or from
// a whole Document (read). Either way the result's strings are views into Trace::strings (or
// static tables), never into the document or the JSON text, which can go once the trace is read.
class TraceReader : public ElementSink {
  public:
    // `json_size`: the size of the JSON to be parsed with this reader as its sink, to size the
    // event array up front (0: unknown).
    explicit TraceReader(std::optional<int64_t> base_override, size_t json_size = 0);
    ~TraceReader() override;

    // `json` (kept alive by the caller) is read by two parsers: when the document's parser, with
    // this reader as its sink, opens the events, a second parser starts on a thread of its own
    // at an element near the middle of the rest (handoff). It reads from there to the events'
    // end while the first reads up to there, then the first takes its events (resume). Where
    // that element is not one of the events, or the second parser fails, its work is dropped
    // and the first reads on: the trace, errors included, is the same.
    void split(std::string_view json) { split_json_ = json; }
    // How long the second parser took, where its events were taken (else 0).
    int64_t split_ns() const { return taken_ns_; }

    // Reads `doc` whole. Throws TraceError.
    Trace read(const Document& doc);
    // The trace of `doc`, parsed from `json` with this reader as its sink. Where the reference
    // rejects an event, or events cannot be read without the whole document, `json` is parsed
    // again (without a sink) into `doc`. Throws TraceError.
    Trace finish(std::unique_ptr<Document>& doc, std::string_view json);

    std::string_view array_key() const override { return "traceEvents"; }

    void begin(uint32_t array) override;
    void element(const Document& doc, uint32_t at) override;
    size_t handoff(size_t array_at) override;
    size_t resume(size_t at) override;

  private:
    std::optional<int64_t> base_override_;
    size_t json_size_;
    int64_t base_;  // time base the events are read with: the override, or 0 until the metadata is read
    Trace trace_;
    std::unordered_map<std::string_view, int64_t> strings_;  // interned pid/tid/id strings
    // categories not in the table and string args: input text -> its one copy in Trace::strings
    std::unordered_map<std::string_view, std::string_view> texts_;
    std::pair<std::string_view, std::string_view> last_category_;  // the last other_category
    // by KeyId: the event field, the kArgAttributes index, the kMemoryAttributes index, or -1
    std::vector<int8_t> field_of_, arg_of_, memory_of_;
    std::string rendered_;  // scratch: an arg rendered as JSON
    std::vector<uint32_t> name_slots_;  // open addressing over trace_.names: id + 1, or 0
    std::vector<uint64_t> name_hashes_;  // by name id
    uint64_t name_seed_;
    static constexpr size_t kNameCacheSize = 256;
    std::array<uint32_t, kNameCacheSize> name_cache_{};  // name id + 1, or 0 (see name_id)
    uint32_t streamed_ = kNoNode;  // the streamed traceEvents array node
    uint32_t total_ = 0;           // its elements so far
    bool failed_ = false;          // an event was rejected
    int64_t latest_ = 0;           // the latest start or end time read
    struct Tail;                   // the second parser (split)
    std::string_view split_json_;  // split(): the JSON, until the second parser starts
    std::unique_ptr<Tail> tail_;
    std::vector<std::unique_ptr<Document>> taken_docs_;  // what its taken strings_ keys point into
    int64_t taken_ns_ = 0;

    void stop_tail();
    void take(TraceReader& tail);  // `tail`'s events after these

    void event(const Document& doc, const JNode& raw, uint32_t ordinal);  // throws TraceError
    void event_args(const Document& doc, const JNode& args, Event& e);
    void memory_args(const Document& doc, const JNode& args, Instant& m);
    std::string_view interned(std::string_view text);  // `text`'s one copy in Trace::strings
    void learn_fields(const Document& doc);  // the tables by KeyId, for the keys `doc` has interned since
    template <typename Where>
    Ident ident(const JNode* n, Where&& where);
    Ident intern(std::string_view s);
    uint32_t name_id(std::string_view name);
    uint32_t hashed_name_id(std::string_view name);
    uint32_t add_name(std::string_view name, uint64_t hash);
    std::string_view other_category(std::string_view cat);  // a category not in the table, interned
};

// Reads `doc`. Throws TraceError.
Trace read_trace(const Document& doc, std::optional<int64_t> base_override);

}  // namespace otelprof
