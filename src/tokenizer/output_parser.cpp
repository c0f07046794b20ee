#include "tokenizer/output_parser.h"

#include <algorithm>
#include <array>
#include <utility>

#include "tokenizer/dsml.h"
#include "tokenizer/tag_scan.h"

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

namespace {

// Calls fn(name, parameters) for each function of an OpenAI `tools` array (`parameters`: its JSON schema object, or
// null when absent or not an object).
template <class F>
void for_each_function(const Json& tools, F fn) {
    if (!tools.is_array()) return;
    for (const Json& tool : tools) {
        if (!tool.is_object()) continue;
        const Json& f = tool.contains("function") ? tool["function"] : tool;
        if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
        const auto params = f.find("parameters");
        static const Json kNone;
        fn(f["name"].get<std::string>(), params != f.end() && params->is_object() ? *params : kNone);
    }
}

}  // namespace

std::map<std::string, std::set<std::string>> string_args_from_tools(const Json& tools) {
    std::map<std::string, std::set<std::string>> out;
    for_each_function(tools, [&](const std::string& name, const Json& params) {
        auto& names = out[name];
        const auto props = params.is_object() ? params.find("properties") : params.end();
        if (props == params.end() || !props->is_object()) return;
        for (const auto& [arg, schema] : props->items())
            if (schema.is_object() && schema.value("type", Json()) == "string") names.insert(arg);
    });
    return out;
}

std::map<std::string, ToolParams> tool_params_from_tools(const Json& tools) {
    std::map<std::string, ToolParams> out;
    for_each_function(tools, [&](const std::string& name, const Json& params) {
        ToolParams& tp = out[name];
        if (!params.is_object()) return;
        if (const auto props = params.find("properties"); props != params.end() && props->is_object())
            for (const auto& [arg, schema] : props->items()) tp.properties.push_back(arg);
        if (const auto req = params.find("required"); req != params.end() && req->is_array())
            for (const Json& r : *req)
                if (r.is_string()) tp.required.insert(r.get<std::string>());
    });
    return out;
}

ParserOptions parser_options_for(ChatFormat format, const ChatOptions& options, const Json& tools) {
    ParserOptions p;
    const bool has_tools = tools.is_array() && !tools.empty();
    p.start_in_reasoning = format == ChatFormat::kDeepSeekV32 ? options.enable_thinking
                                                              : prompt_opens_reasoning(format, options);
    p.parse_tool_calls = has_tools && (format == ChatFormat::kGlm5 || format == ChatFormat::kDeepSeekV32);
    p.tool_syntax = format == ChatFormat::kDeepSeekV32 ? ToolCallSyntax::kDsml : ToolCallSyntax::kGlm;
    p.string_args = string_args_from_tools(tools);
    if (format == ChatFormat::kDeepSeekV32) p.tool_params = tool_params_from_tools(tools);
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

namespace {

// The format writes content + "\n\n" + a DSML block; that blank line belongs to the block (the reference parser's
// start token is "\n\n<｜DSML｜function_calls"), so it is cut from the content before a block.
constexpr std::string_view kDsmlSeparator = "\n\n";

std::string_view without_dsml_separator(std::string_view content) {
    if (content.ends_with(kDsmlSeparator)) content.remove_suffix(kDsmlSeparator.size());
    return content;
}

// Parses the DSML block whose body starts at `p` (just after its opening tag); appends its named calls to `out`.
// Returns the position after the block (text.size() when unterminated).
size_t parse_dsml_calls(std::string_view text, size_t p, const ParserOptions& opt, ParsedOutput& out) {
    const DsmlBlock b = parse_dsml_block(text.substr(p), /*final=*/true);
    for (const DsmlInvoke& inv : b.invokes) {
        if (inv.name.empty()) continue;
        const int index = static_cast<int>(out.tool_calls.size());
        out.tool_calls.push_back({call_id(opt, index), inv.name, dsml_arguments(inv, opt, true)});
    }
    return b.closed ? p + b.end : text.size();
}

}  // namespace

ParsedOutput parse_output(std::string_view text, const ParserOptions& opt) {
    ParsedOutput out;
    size_t pos = 0;
    bool reasoning = opt.parse_reasoning && opt.start_in_reasoning;
    const bool dsml = opt.parse_tool_calls && opt.tool_syntax == ToolCallSyntax::kDsml;
    const bool glm = opt.parse_tool_calls && opt.tool_syntax == ToolCallSyntax::kGlm;
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
                                                   glm ? kCallOpen : std::string_view(),
                                                   dsml ? kDsmlBlockOpen : std::string_view(),
                                                   dsml ? kDsmlBlockOpenAlt : std::string_view()},
                                  pos);
        std::string_view before = text.substr(pos, hit.first == npos ? npos : hit.first - pos);
        const bool block = hit.second == kDsmlBlockOpen || hit.second == kDsmlBlockOpenAlt;
        if (block) before = without_dsml_separator(before);
        out.content += before;
        if (hit.first == npos) break;
        pos = hit.first + hit.second.size();
        if (hit.second == kThinkOpen)
            reasoning = true;
        else if (block)
            pos = parse_dsml_calls(text, pos, opt, out);
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
    const bool dsml = opt_.parse_tool_calls && opt_.tool_syntax == ToolCallSyntax::kDsml;
    const std::array<std::string_view, 3> content_tags{
        opt_.parse_reasoning ? kThinkOpen : std::string_view(),
        opt_.parse_tool_calls ? (dsml ? kDsmlBlockOpen : kCallOpen) : std::string_view(),
        dsml ? kDsmlBlockOpenAlt : std::string_view()};

    while (true) {
        if (state_ == State::kDsml) {
            if (run_dsml(final)) continue;
            return;
        }
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
            case State::kDsml: break;  // handled above
        }
        const auto [pos, tag] = find_tag(std::string_view(buf_), tags);
        if (pos != npos) {
            std::string_view before = std::string_view(buf_).substr(0, pos);
            if (tag == kDsmlBlockOpen || tag == kDsmlBlockOpenAlt) before = without_dsml_separator(before);
            take_text(before);
            const std::string t(tag);  // buf_ is about to change
            buf_.erase(0, pos + t.size());
            on_tag(t);
            continue;
        }
        size_t safe = buf_.size();
        if (!final) {
            safe -= tag_holdback(std::string_view(buf_), tags);
            // Newlines ending the content may be the separator before a DSML block (and be cut): held until decided.
            if (dsml && state_ == State::kContent)
                for (size_t k = 0; k < kDsmlSeparator.size() && safe > 0 && buf_[safe - 1] == '\n'; ++k) --safe;
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
        case State::kSkipCall:
        case State::kDsml: break;  // text between the tags of a call is ignored
    }
}

void StreamingOutputParser::on_tag(std::string_view tag) {
    switch (state_) {
        case State::kContent:
            if (tag == kThinkOpen) {
                state_ = State::kReasoning;
                think_block_start_ = true;
            } else if (tag == kDsmlBlockOpen || tag == kDsmlBlockOpenAlt) {
                state_ = State::kDsml;
                dsml_body_.clear();
                dsml_call_.clear();
                dsml_sent_.clear();
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
        case State::kDsml: break;  // run_dsml() reads the block
    }
}

// The open DSML block: the body read so far is parsed again, and what became certain is sent — a call's begin
// once its name is read, then its arguments text as it grows (dsml_arguments never takes text back). Returns
// true when the block closed (the text after it is content again).
bool StreamingOutputParser::run_dsml(bool final) {
    dsml_body_ += buf_;
    buf_.clear();
    const DsmlBlock b = parse_dsml_block(dsml_body_, final);
    for (size_t k = 0; k < b.invokes.size(); ++k) {
        const DsmlInvoke& inv = b.invokes[k];
        if (k == dsml_call_.size()) {
            dsml_sent_.push_back(0);
            dsml_call_.push_back(inv.name.empty() ? -1 : n_calls_++);
            if (dsml_call_.back() >= 0) {
                i_call_ = dsml_call_.back();
                call_name_ = inv.name;
                emit(StreamDelta::Kind::kToolCallBegin, {});
            }
        }
        if (dsml_call_[k] < 0) continue;
        i_call_ = dsml_call_[k];
        const std::string args = dsml_arguments(inv, opt_, inv.closed);
        if (args.size() > dsml_sent_[k]) {
            emit(StreamDelta::Kind::kToolCallArguments, std::string_view(args).substr(dsml_sent_[k]));
            dsml_sent_[k] = args.size();
        }
    }
    if (!b.closed) return false;
    buf_ = dsml_body_.substr(b.end);
    dsml_body_.clear();
    state_ = State::kContent;
    return true;
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
