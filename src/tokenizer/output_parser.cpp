#include "tokenizer/output_parser.h"

#include <algorithm>
#include <array>
#include <utility>

namespace megactx::chat {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";

constexpr size_t npos = std::string_view::npos;

// Leftmost occurrence of any tag in s (from `from`): {position, tag}; {npos, ""} when none. No tag is a prefix
// of another, so at most one matches at a position.
template <size_t N>
std::pair<size_t, std::string_view> find_tag(std::string_view s, const std::array<std::string_view, N>& tags,
                                             size_t from = 0) {
    std::pair<size_t, std::string_view> best{npos, {}};
    for (std::string_view t : tags) {
        if (t.empty()) continue;
        const size_t p = s.find(t, from);
        if (p < best.first) best = {p, t};
    }
    return best;
}

// Length of the longest suffix of s that is a proper prefix of one of the tags (text that may still become one).
template <size_t N>
size_t tag_holdback(std::string_view s, const std::array<std::string_view, N>& tags) {
    size_t best = 0;
    for (std::string_view t : tags)
        for (size_t k = std::min(t.size() - (t.empty() ? 0 : 1), s.size()); k > best; --k)
            if (s.substr(s.size() - k) == t.substr(0, k)) {
                best = k;
                break;
            }
    return best;
}

std::string json_string(std::string_view s) {
    std::string out = "\"";
    append_json_escaped(out, s);
    out += '"';
    return out;
}

// A value whose schema type is not "string": JSON when the stripped text parses as a non-string JSON value,
// else the stripped text as a JSON string (vLLM glm47 `_deserialize(value.strip())`, minus ast.literal_eval).
std::string loose_value_json(std::string_view raw) {
    const std::string_view s = py_strip(raw);
    const Json v = Json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
    if (!v.is_discarded() && !v.is_string()) return py_json_dumps(v);
    return json_string(s);
}

bool is_string_arg(const ParserOptions& opt, const std::string& name, const std::string& key) {
    const auto it = opt.string_args.find(name);
    return it != opt.string_args.end() && it->second.count(key) > 0;
}

std::string call_id(const ParserOptions& opt, int index) { return opt.id_prefix + std::to_string(index); }

}  // namespace

std::map<std::string, std::set<std::string>> string_args_from_tools(const Json& tools) {
    std::map<std::string, std::set<std::string>> out;
    if (!tools.is_array()) return out;
    for (const Json& tool : tools) {
        if (!tool.is_object()) continue;
        const Json& fn = tool.contains("function") ? tool["function"] : tool;
        if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) continue;
        auto& names = out[fn["name"].get<std::string>()];
        const auto params = fn.find("parameters");
        if (params == fn.end() || !params->is_object()) continue;
        const auto props = params->find("properties");
        if (props == params->end() || !props->is_object()) continue;
        for (const auto& [arg, schema] : props->items())
            if (schema.is_object() && schema.value("type", Json()) == "string") names.insert(arg);
    }
    return out;
}

ParserOptions parser_options_for(ChatFormat format, const ChatOptions& options, const Json& tools) {
    ParserOptions p;
    p.start_in_reasoning = prompt_opens_reasoning(format, options);
    p.parse_tool_calls = format == ChatFormat::kGlm5 && tools.is_array() && !tools.empty();
    p.string_args = string_args_from_tools(tools);
    return p;
}

Json ParsedOutput::to_openai_message() const {
    Json m = {{"role", "assistant"}, {"content", content.empty() ? Json() : Json(content)}};
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    if (!tool_calls.empty()) {
        Json calls = Json::array();
        for (const auto& tc : tool_calls)
            calls.push_back({{"id", tc.id},
                             {"type", "function"},
                             {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
        m["tool_calls"] = std::move(calls);
    }
    return m;
}

Json StreamDelta::to_openai() const {
    switch (kind) {
        case Kind::kContent: return {{"content", text}};
        case Kind::kReasoning: return {{"reasoning_content", text}};
        case Kind::kToolCallBegin:
            return {{"tool_calls", Json::array({{{"index", index},
                                                 {"id", id},
                                                 {"type", "function"},
                                                 {"function", {{"name", name}, {"arguments", ""}}}}})}};
        case Kind::kToolCallArguments:
            return {{"tool_calls", Json::array({{{"index", index}, {"function", {{"arguments", text}}}}})}};
    }
    return Json::object();
}

// ---- whole-text parser --------------------------------------------------------------------------------------

namespace {

// Parses one tool call whose body starts at `p` (just after `<tool_call>`); appends it to `out` unless its name
// is empty. Returns the position after its `</tool_call>` (or text.size() when unterminated).
size_t parse_one_call(std::string_view text, size_t p, const ParserOptions& opt, ParsedOutput& out) {
    const auto end_of = [&](std::pair<size_t, std::string_view> hit) {
        return hit.first == npos ? text.size() : hit.first + hit.second.size();
    };
    auto hit = find_tag(text, std::array{kKeyOpen, kCallClose}, p);
    const std::string name(py_strip(text.substr(p, (hit.first == npos ? text.size() : hit.first) - p)));
    if (name.empty()) {
        if (hit.second == kKeyOpen) return end_of({text.find(kCallClose, hit.first), kCallClose});
        return end_of(hit);
    }

    std::vector<std::pair<std::string, std::string>> pairs;  // key, JSON value text
    std::set<std::string> seen;
    size_t q = end_of(hit);
    while (hit.second == kKeyOpen) {
        hit = find_tag(text, std::array{kKeyClose, kCallClose}, q);
        const size_t key_end = hit.first;
        const size_t key_begin = std::exchange(q, end_of(hit));
        if (hit.second != kKeyClose) break;  // an unterminated key is dropped
        const std::string key(py_strip(text.substr(key_begin, key_end - key_begin)));
        hit = find_tag(text, std::array{kValueOpen, kKeyOpen, kCallClose}, q);
        q = end_of(hit);
        if (hit.second != kValueOpen) continue;  // a key without a value is dropped
        hit = find_tag(text, std::array{kValueClose, kCallClose}, q);
        const std::string_view raw = text.substr(q, (hit.first == npos ? text.size() : hit.first) - q);
        q = end_of(hit);
        if (seen.insert(key).second)
            pairs.emplace_back(key, is_string_arg(opt, name, key) ? json_string(raw) : loose_value_json(raw));
        if (hit.second != kValueClose) break;
        hit = find_tag(text, std::array{kKeyOpen, kCallClose}, q);
        q = end_of(hit);
    }

    std::string args = "{";
    for (size_t i = 0; i < pairs.size(); ++i) {
        if (i) args += ", ";
        args += json_string(pairs[i].first) + ": " + pairs[i].second;
    }
    args += '}';
    const int index = static_cast<int>(out.tool_calls.size());
    out.tool_calls.push_back({call_id(opt, index), name, std::move(args)});
    return q;
}

}  // namespace

ParsedOutput parse_output(std::string_view text, const ParserOptions& opt) {
    ParsedOutput out;
    size_t pos = 0;
    bool reasoning = opt.parse_reasoning && opt.start_in_reasoning;
    while (pos <= text.size()) {
        if (reasoning) {
            if (text.substr(pos).starts_with(kThinkOpen)) pos += kThinkOpen.size();
            const size_t end = text.find(kThinkClose, pos);
            out.reasoning += text.substr(pos, end == npos ? npos : end - pos);
            if (end == npos) break;
            pos = end + kThinkClose.size();
            reasoning = false;
            continue;
        }
        const auto hit = find_tag(text, std::array{opt.parse_reasoning ? kThinkOpen : std::string_view(),
                                                   opt.parse_tool_calls ? kCallOpen : std::string_view()},
                                  pos);
        out.content += text.substr(pos, hit.first == npos ? npos : hit.first - pos);
        if (hit.first == npos) break;
        pos = hit.first + hit.second.size();
        if (hit.second == kThinkOpen)
            reasoning = true;
        else
            pos = parse_one_call(text, pos, opt, out);
    }
    return out;
}

// ---- streaming parser ---------------------------------------------------------------------------------------

StreamingOutputParser::StreamingOutputParser(ParserOptions options)
    : opt_(std::move(options)),
      state_(opt_.parse_reasoning && opt_.start_in_reasoning ? State::kReasoning : State::kContent),
      think_block_start_(state_ == State::kReasoning) {}

std::vector<StreamDelta> StreamingOutputParser::feed(std::string_view chunk) {
    buf_.append(chunk);
    run(false);
    return std::exchange(out_, {});
}

std::vector<StreamDelta> StreamingOutputParser::finish() {
    run(true);
    return std::exchange(out_, {});
}

void StreamingOutputParser::emit(StreamDelta::Kind kind, std::string_view text) {
    using Kind = StreamDelta::Kind;
    const bool is_call = kind == Kind::kToolCallBegin || kind == Kind::kToolCallArguments;
    if (kind != Kind::kToolCallBegin) {
        if (text.empty()) return;
        if (!out_.empty() && out_.back().kind == kind && (!is_call || out_.back().index == i_call_)) {
            out_.back().text.append(text);
            return;
        }
    }
    StreamDelta d;
    d.kind = kind;
    if (is_call) d.index = i_call_;
    if (kind == Kind::kToolCallBegin) {
        d.id = call_id(opt_, i_call_);
        d.name = call_name_;
    } else {
        d.text = text;
    }
    out_.push_back(std::move(d));
}

bool StreamingOutputParser::emits_text() const {
    return state_ == State::kContent || state_ == State::kReasoning ||
           (state_ == State::kArgValue && value_is_string_ && !value_skip_);
}

void StreamingOutputParser::run(bool final) {
    static constexpr std::array<std::string_view, 2> kNameTags{kKeyOpen, kCallClose};
    static constexpr std::array<std::string_view, 2> kKeyTags{kKeyClose, kCallClose};
    static constexpr std::array<std::string_view, 3> kAfterKeyTags{kValueOpen, kKeyOpen, kCallClose};
    static constexpr std::array<std::string_view, 2> kValueTags{kValueClose, kCallClose};
    const std::array<std::string_view, 3> content_tags{opt_.parse_reasoning ? kThinkOpen : std::string_view(),
                                                       opt_.parse_tool_calls ? kCallOpen : std::string_view(),
                                                       std::string_view()};

    while (true) {
        if (state_ == State::kReasoning && think_block_start_) {
            if (std::string_view(buf_).starts_with(kThinkOpen)) {
                buf_.erase(0, kThinkOpen.size());
                think_block_start_ = false;
                continue;
            }
            if (!final && kThinkOpen.starts_with(buf_)) return;  // could still become `<think>`
            think_block_start_ = false;
        }
        // The tags that end the current state, padded to three entries.
        std::array<std::string_view, 3> tags{};
        switch (state_) {
            case State::kContent: tags = content_tags; break;
            case State::kReasoning: tags = {kThinkClose}; break;
            case State::kToolName:
            case State::kArgs: tags = {kNameTags[0], kNameTags[1]}; break;
            case State::kArgKey: tags = {kKeyTags[0], kKeyTags[1]}; break;
            case State::kAfterKey: tags = kAfterKeyTags; break;
            case State::kArgValue: tags = {kValueTags[0], kValueTags[1]}; break;
            case State::kSkipCall: tags = {kCallClose}; break;
        }
        const auto [pos, tag] = find_tag(std::string_view(buf_), tags);
        if (pos != npos) {
            take_text(std::string_view(buf_).substr(0, pos));
            const std::string t(tag);  // buf_ is about to change
            buf_.erase(0, pos + t.size());
            on_tag(t);
            continue;
        }
        size_t safe = buf_.size();
        if (!final) {
            safe -= tag_holdback(std::string_view(buf_), tags);
            if (emits_text()) safe = utf8_complete_prefix(std::string_view(buf_).substr(0, safe));
        }
        take_text(std::string_view(buf_).substr(0, safe));
        buf_.erase(0, safe);
        if (final) on_end();
        return;
    }
}

void StreamingOutputParser::take_text(std::string_view s) {
    if (s.empty()) return;
    switch (state_) {
        case State::kContent: emit(StreamDelta::Kind::kContent, s); break;
        case State::kReasoning: emit(StreamDelta::Kind::kReasoning, s); break;
        case State::kToolName: name_.append(s); break;
        case State::kArgKey: key_.append(s); break;
        case State::kArgValue:
            if (value_skip_) break;
            if (value_is_string_) {
                std::string escaped;
                append_json_escaped(escaped, s);
                emit(StreamDelta::Kind::kToolCallArguments, escaped);
            } else {
                value_.append(s);
            }
            break;
        case State::kArgs:
        case State::kAfterKey:
        case State::kSkipCall: break;  // text between the tags of a call is ignored
    }
}

void StreamingOutputParser::on_tag(std::string_view tag) {
    switch (state_) {
        case State::kContent:
            if (tag == kThinkOpen) {
                state_ = State::kReasoning;
                think_block_start_ = true;
            } else {
                state_ = State::kToolName;
                name_.clear();
            }
            break;
        case State::kReasoning: state_ = State::kContent; break;
        case State::kToolName:
            if (!begin_call()) {
                state_ = tag == kKeyOpen ? State::kSkipCall : State::kContent;
                break;
            }
            [[fallthrough]];
        case State::kArgs:
            if (tag == kKeyOpen) {
                state_ = State::kArgKey;
                key_.clear();
            } else {
                close_call();
            }
            break;
        case State::kArgKey:
            if (tag == kKeyClose) {
                key_ = std::string(py_strip(key_));
                state_ = State::kAfterKey;
            } else {
                close_call();
            }
            break;
        case State::kAfterKey:
            if (tag == kValueOpen) {
                begin_value();
            } else if (tag == kKeyOpen) {
                state_ = State::kArgKey;  // the previous key had no value: dropped
                key_.clear();
            } else {
                close_call();
            }
            break;
        case State::kArgValue:
            end_value();
            if (tag == kValueClose)
                state_ = State::kArgs;
            else
                close_call();
            break;
        case State::kSkipCall: state_ = State::kContent; break;
    }
}

void StreamingOutputParser::on_end() {
    switch (state_) {
        case State::kToolName:
            if (begin_call()) close_call();
            break;
        case State::kArgValue:
            end_value();
            close_call();
            break;
        case State::kArgs:
        case State::kArgKey:
        case State::kAfterKey: close_call(); break;
        default: break;
    }
}

bool StreamingOutputParser::begin_call() {
    call_name_ = std::string(py_strip(name_));
    if (call_name_.empty()) return false;
    i_call_ = n_calls_++;
    n_pairs_ = 0;
    keys_.clear();
    emit(StreamDelta::Kind::kToolCallBegin, {});
    return true;
}

void StreamingOutputParser::begin_value() {
    state_ = State::kArgValue;
    value_skip_ = !keys_.insert(key_).second;  // a repeated key: the first one wins
    if (value_skip_) return;
    value_is_string_ = is_string_arg(opt_, call_name_, key_);
    value_.clear();
    std::string head = n_pairs_++ ? ", " : "{";
    head += json_string(key_);
    head += value_is_string_ ? ": \"" : ": ";
    emit(StreamDelta::Kind::kToolCallArguments, head);
}

void StreamingOutputParser::end_value() {
    if (value_skip_) return;
    emit(StreamDelta::Kind::kToolCallArguments, value_is_string_ ? "\"" : loose_value_json(value_));
}

void StreamingOutputParser::close_call() {
    emit(StreamDelta::Kind::kToolCallArguments, n_pairs_ ? "}" : "{}");
    state_ = State::kContent;
}

}  // namespace megactx::chat
