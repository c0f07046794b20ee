#include "server/structured_output.h"

#include <fmt/format.h>

#include "grammar/frontends.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

using Json = chat::Json;

namespace {

ConstraintSpec make_spec(ConstraintSpec::Kind kind, std::string source, std::string param,
                         std::vector<std::string> choices = {}) {
    ConstraintSpec s;
    s.kind = kind;
    s.source = std::move(source);
    s.param = std::move(param);
    s.choices = std::move(choices);
    return s;
}

const Json* field(const Json& j, const char* key) {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

// A JSON Schema given as an object or (SGLang, vLLM's guided_json) as a string holding one.
std::string schema_text(const Json& v, const std::string& param) {
    if (v.is_object() || v.is_boolean()) return v.dump();
    if (v.is_string()) {
        try {
            const Json parsed = Json::parse(v.get<std::string>());
            if (parsed.is_object() || parsed.is_boolean()) return parsed.dump();
        } catch (const std::exception& e) {
            throw ApiError(400, fmt::format("'{}' is not valid JSON: {}", param, e.what()), param);
        }
    }
    throw ApiError(400, fmt::format("'{}' must be a JSON Schema (an object, or a string holding one)", param), param);
}

std::string string_of(const Json& v, const std::string& param) {
    if (!v.is_string() || v.get<std::string>().empty())
        throw ApiError(400, fmt::format("'{}' must be a non-empty string", param), param);
    return v.get<std::string>();
}

std::vector<std::string> choices_of(const Json& v, const std::string& param) {
    if (!v.is_array() || v.empty())
        throw ApiError(400, fmt::format("'{}' must be a non-empty list of strings", param), param);
    std::vector<std::string> out;
    for (const Json& c : v) {
        if (!c.is_string()) throw ApiError(400, fmt::format("'{}' must be a list of strings", param), param);
        out.push_back(c.get<std::string>());
    }
    return out;
}

ConstraintSpec from_response_format(const Json& rf) {
    const std::string param = "response_format";
    const Json* type = rf.is_object() ? field(rf, "type") : nullptr;
    if (!type || !type->is_string()) throw ApiError(400, "'response_format' must be an object with a 'type'", param);
    ConstraintSpec s;
    s.param = param;
    const std::string t = type->get<std::string>();
    if (t == "text") return ConstraintSpec{};
    if (t == "json_object") {
        s.kind = ConstraintSpec::Kind::kJsonObject;
        return s;
    }
    if (t != "json_schema")
        throw ApiError(400, fmt::format("response_format type '{}' is unknown (text, json_object, json_schema)", t),
                       param);
    const Json* js = field(rf, "json_schema");
    if (!js || !js->is_object())
        throw ApiError(400, "response_format 'json_schema' needs a 'json_schema' object holding 'schema'", param);
    const Json* schema = field(*js, "schema");
    if (!schema) throw ApiError(400, "'response_format.json_schema.schema' is required", param);
    s.kind = ConstraintSpec::Kind::kJsonSchema;
    s.source = schema_text(*schema, "response_format.json_schema.schema");
    if (const Json* strict = field(*js, "strict")) {
        if (!strict->is_boolean()) throw ApiError(400, "'response_format.json_schema.strict' must be true or false", param);
        s.strict = strict->get<bool>();
    }
    return s;
}

// vLLM's structured_outputs object (and, with prefix "guided_", its older top-level fields).
void from_vllm(const Json& obj, const std::string& prefix, const std::string& where, std::vector<ConstraintSpec>& found) {
    const auto name = [&](const char* k) { return where.empty() ? prefix + k : where + "." + k; };
    const auto add = [&](ConstraintSpec s) { found.push_back(std::move(s)); };
    if (const Json* v = field(obj, (prefix + "json").c_str())) {
        add(make_spec(ConstraintSpec::Kind::kJsonSchema, schema_text(*v, name("json")), name("json")));
    }
    if (const Json* v = field(obj, (prefix + "regex").c_str()))
        add(make_spec(ConstraintSpec::Kind::kRegex, string_of(*v, name("regex")), name("regex")));
    if (const Json* v = field(obj, (prefix + "choice").c_str()))
        add(make_spec(ConstraintSpec::Kind::kChoice, "", name("choice"), choices_of(*v, name("choice"))));
    if (const Json* v = field(obj, (prefix + "grammar").c_str()))
        add(make_spec(ConstraintSpec::Kind::kGrammar, string_of(*v, name("grammar")), name("grammar")));
    if (prefix.empty()) {
        if (const Json* v = field(obj, "json_object"); v && v->is_boolean() && v->get<bool>())
            add(make_spec(ConstraintSpec::Kind::kJsonObject, "", name("json_object")));
        for (const char* k : {"structural_tag", "whitespace_pattern"})
            if (field(obj, k))
                throw ApiError(400, fmt::format("'{}.{}' is not supported", where, k), fmt::format("{}.{}", where, k));
    }
}

}  // namespace

ConstraintSpec find_constraint(const Json& body) {
    std::vector<ConstraintSpec> found;
    if (const Json* rf = field(body, "response_format")) {
        ConstraintSpec s = from_response_format(*rf);
        if (s.kind != ConstraintSpec::Kind::kNone) found.push_back(std::move(s));
    }
    if (const Json* so = field(body, "structured_outputs")) {
        if (!so->is_object()) throw ApiError(400, "'structured_outputs' must be an object", "structured_outputs");
        from_vllm(*so, "", "structured_outputs", found);
    }
    from_vllm(body, "guided_", "", found);
    if (const Json* v = field(body, "regex"))  // SGLang
        found.push_back(make_spec(ConstraintSpec::Kind::kRegex, string_of(*v, "regex"), "regex"));
    if (const Json* v = field(body, "ebnf"))  // SGLang
        found.push_back(make_spec(ConstraintSpec::Kind::kGrammar, string_of(*v, "ebnf"), "ebnf"));
    if (const Json* v = field(body, "grammar"))  // llama.cpp
        found.push_back(make_spec(ConstraintSpec::Kind::kGrammar, string_of(*v, "grammar"), "grammar"));
    if (const Json* v = field(body, "json_schema"))  // llama.cpp (an object), SGLang (a string)
        found.push_back(make_spec(ConstraintSpec::Kind::kJsonSchema, schema_text(*v, "json_schema"), "json_schema"));
    if (found.size() > 1)
        throw ApiError(400,
                       fmt::format("'{}' and '{}' both constrain the output: send one", found[0].param, found[1].param),
                       found[1].param);
    return found.empty() ? ConstraintSpec{} : found[0];
}

ConstraintCompiler::ConstraintCompiler(const Tokenizer& tokenizer, std::vector<int32_t> stop_ids, size_t cache_entries)
    : tokenizer_(tokenizer), stop_ids_(std::move(stop_ids)), cache_entries_(std::max<size_t>(cache_entries, 1)) {}

int64_t ConstraintCompiler::cache_hits() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hits_;
}

namespace {

// Masks kept per cached grammar: 8 MiB at a 128K-token vocabulary, so a full grammar cache stays within a few GiB
// even in the worst case; a grammar's loops need far fewer distinct states.
constexpr size_t kMasksPerGrammar = 512;

}  // namespace

namespace {

// The cache's key: the normalised constraint (kind, options, text), the content's nested.
std::string cache_key(const ConstraintSpec& spec) {
    std::string key = fmt::format("{}|{}|", static_cast<int>(spec.kind), spec.strict ? 1 : 0);
    if (spec.kind == ConstraintSpec::Kind::kToolCalls)
        key += fmt::format("{}|{}|{}|{}|", spec.tool_name, spec.single_call, spec.text_first, spec.dsml);
    if (spec.kind == ConstraintSpec::Kind::kChoice) {
        for (const std::string& c : spec.choices) key += fmt::format("{}:{}|", c.size(), c);
    } else {
        key += spec.source;
    }
    if (spec.content) key += fmt::format("|content:{}", cache_key(*spec.content));
    return key;
}

// The grammar of `spec` (not kNone). ApiError 400 naming the field whose grammar does not compile.
grammar::Grammar build_grammar(const ConstraintSpec& spec) {
    grammar::JsonSchemaOptions jo;
    jo.additional_properties_default = !spec.strict;
    try {
        switch (spec.kind) {
            case ConstraintSpec::Kind::kJsonSchema:
                return grammar::compile_json_schema(spec.source, jo);
            case ConstraintSpec::Kind::kJsonObject:
                return grammar::json_object_grammar(jo);
            case ConstraintSpec::Kind::kRegex:
                return grammar::compile_regex(spec.source);
            case ConstraintSpec::Kind::kChoice:
                return grammar::compile_choices(spec.choices);
            case ConstraintSpec::Kind::kGrammar:
                return grammar::parse_gbnf(spec.source);
            case ConstraintSpec::Kind::kToolCalls:
            case ConstraintSpec::Kind::kNone:
                break;
        }
        if (spec.kind == ConstraintSpec::Kind::kNone) throw std::logic_error("build_grammar: no constraint");
        grammar::ToolCallOptions to;
        to.format = spec.dsml ? grammar::ToolCallFormat::kDsml : grammar::ToolCallFormat::kGlm;
        to.only = spec.tool_name;
        to.single = spec.single_call;
        to.text_first = spec.text_first;
        if (spec.content) to.text = std::make_shared<const grammar::Grammar>(build_grammar(*spec.content));
        return grammar::compile_tool_calls(spec.source, to);
    } catch (const grammar::GrammarError& e) {
        throw ApiError(400, fmt::format("'{}': {}", spec.param, e.what()), spec.param);
    }
}

}  // namespace

std::shared_ptr<const OutputConstraint> ConstraintCompiler::compile(const ConstraintSpec& spec, int32_t start_after) {
    if (spec.kind == ConstraintSpec::Kind::kNone) return nullptr;
    std::call_once(vocab_once_, [this] { vocab_ = make_token_vocab(tokenizer_, stop_ids_); });
    const std::string key = cache_key(spec);
    std::shared_ptr<const grammar::Grammar> g;
    std::shared_ptr<grammar::MaskCache> masks;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (const auto it = cache_.find(key); it != cache_.end()) {
            lru_.splice(lru_.begin(), lru_, it->second.second);
            g = it->second.first.grammar;
            masks = it->second.first.masks;
            ++hits_;
        }
    }
    if (!g) {
        g = std::make_shared<const grammar::Grammar>(build_grammar(spec));
        masks = std::make_shared<grammar::MaskCache>(kMasksPerGrammar);
        std::lock_guard<std::mutex> lock(mu_);
        if (cache_.find(key) == cache_.end()) {
            lru_.push_front(key);
            cache_.emplace(key, std::make_pair(Entry{g, masks}, lru_.begin()));
            if (cache_.size() > cache_entries_) {
                cache_.erase(lru_.back());
                lru_.pop_back();
            }
        }
    }
    auto c = std::make_shared<OutputConstraint>();
    c->grammar = std::move(g);
    c->vocab = vocab_;
    c->start_after = start_after;
    c->masks = std::move(masks);
    return c;
}

}  // namespace megactx
