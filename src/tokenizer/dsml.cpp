#include "tokenizer/dsml.h"

#include <algorithm>
#include <array>
#include <optional>
#include <set>
#include <tuple>

#include "tokenizer/tag_scan.h"

namespace megactx::chat {

namespace {

constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke";
constexpr std::string_view kInvokeClose = "</｜DSML｜invoke>";
constexpr std::string_view kParamOpen = "<｜DSML｜parameter";
constexpr std::string_view kParamClose = "</｜DSML｜parameter>";
constexpr std::string_view kBlockClose = "</｜DSML｜function_calls>";
constexpr std::string_view kBlockCloseAlt = "</｜DSML｜tool_calls>";
constexpr size_t npos = std::string_view::npos;

bool closes_block(std::string_view tag) { return tag == kBlockClose || tag == kBlockCloseAlt; }

// `key="value"` inside a tag header; "" when absent.
std::string attribute(std::string_view header, std::string_view key) {
    for (size_t from = 0;;) {
        const size_t p = header.find(key, from);
        if (p == npos) return {};
        from = p + key.size();
        const bool word_start = p == 0 || header[p - 1] == ' ' || header[p - 1] == '\t' || header[p - 1] == '\n';
        if (!word_start || header.substr(from, 2) != "=\"") continue;
        const size_t end = header.find('"', from + 2);
        return std::string(header.substr(from + 2, end == npos ? npos : end - from - 2));
    }
}

std::string json_string(std::string_view s) {
    std::string out = "\"";
    append_json_escaped(out, s);
    out += '"';
    return out;
}

}  // namespace

DsmlBlock parse_dsml_block(std::string_view body, bool final) {
    static constexpr std::array<std::string_view, 3> kBlockTags{kInvokeOpen, kBlockClose, kBlockCloseAlt};
    static constexpr std::array<std::string_view, 4> kInvokeTags{kParamOpen, kInvokeClose, kBlockClose, kBlockCloseAlt};
    static constexpr std::array<std::string_view, 4> kValueTags{kParamClose, kInvokeClose, kBlockClose, kBlockCloseAlt};
    DsmlBlock b;
    size_t pos = 0;
    const auto close_invoke = [&](std::string_view tag, size_t after) {
        b.invokes.back().closed = true;
        if (closes_block(tag)) {
            b.closed = true;
            b.end = after;
        }
        pos = after;
    };
    while (!b.closed) {
        // Between invokes: text is ignored up to the next invoke or the end of the block.
        auto [at, tag] = find_tag(body, kBlockTags, pos);
        if (at == npos) return b;
        if (closes_block(tag)) {
            b.closed = true;
            b.end = at + tag.size();
            return b;
        }
        const size_t header_end = body.find('>', at + tag.size());
        if (header_end == npos) return b;  // the header is still coming (or, at the end, dropped)
        b.invokes.push_back({attribute(body.substr(at + tag.size(), header_end - at - tag.size()), "name"), {}, false});
        pos = header_end + 1;

        while (!b.invokes.back().closed) {
            std::tie(at, tag) = find_tag(body, kInvokeTags, pos);
            if (at == npos) {
                if (final) b.invokes.back().closed = true;
                return b;
            }
            if (tag != kParamOpen) {
                close_invoke(tag, at + tag.size());
                break;
            }
            const size_t p_header_end = body.find('>', at + tag.size());
            if (p_header_end == npos) {
                if (final) b.invokes.back().closed = true;
                return b;
            }
            const std::string_view header = body.substr(at + tag.size(), p_header_end - at - tag.size());
            DsmlParameter param{attribute(header, "name"), attribute(header, "string"), {}, false};
            const size_t v = p_header_end + 1;
            std::tie(at, tag) = find_tag(body, kValueTags, v);
            if (at == npos) {
                // An open value: at the end it is complete; before, keep back what may become a closing tag or
                // finish a UTF-8 character.
                std::string_view value = body.substr(v);
                if (!final)
                    value = value.substr(
                        0, utf8_complete_prefix(value.substr(0, value.size() - tag_holdback(value, kValueTags))));
                param.value = std::string(value);
                param.closed = final;
                b.invokes.back().params.push_back(std::move(param));
                if (final) b.invokes.back().closed = true;
                return b;
            }
            param.value = std::string(body.substr(v, at - v));
            param.closed = true;
            b.invokes.back().params.push_back(std::move(param));
            if (tag == kParamClose) {
                pos = at + tag.size();
            } else {
                close_invoke(tag, at + tag.size());  // a missing parameter close: the invoke (or block) ends it
            }
        }
    }
    return b;
}

namespace {

bool is_string_param(const DsmlParameter& p, const ParserOptions& opt, const std::string& tool) {
    if (p.string_attr == "true") return true;
    if (p.string_attr == "false") return false;
    const auto it = opt.string_args.find(tool);
    return it != opt.string_args.end() && it->second.count(p.name) > 0;
}

// A `string="false"` value: JSON when the stripped text parses (printed json.dumps style), else that text as a
// JSON string, so the arguments are always valid JSON.
Json typed_value(const DsmlParameter& p, const ParserOptions& opt, const std::string& tool) {
    if (is_string_param(p, opt, tool)) return Json(p.value);
    const std::string_view s = py_strip(p.value);
    Json v = Json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
    return v.is_discarded() ? Json(std::string(s)) : v;
}

bool is_wrapper_name(const std::string& name) { return name == "arguments" || name == "input"; }

// Whether a parameter named like this could be the spurious wrapper: the tool is known and does not declare it.
bool may_be_wrapper(const std::string& name, const ParserOptions& opt, const std::string& tool) {
    if (!is_wrapper_name(name)) return false;
    const auto it = opt.tool_params.find(tool);
    if (it == opt.tool_params.end()) return false;
    const auto& props = it->second.properties;
    return std::find(props.begin(), props.end(), name) == props.end();
}

// DeepSeek-V3.2 sometimes wraps the real arguments in one parameter named `arguments` (or `input`) that the tool
// does not declare: `{"arguments": {"path": "/x"}}`, the object as JSON text, or, for a tool taking one string,
// the bare value. Returns the repaired arguments, or nullopt when the call is not such a wrapper.
std::optional<Json> unwrap(const DsmlParameter& p, const ParserOptions& opt, const std::string& tool) {
    if (!may_be_wrapper(p.name, opt, tool)) return std::nullopt;
    Json v = typed_value(p, opt, tool);
    if (v.is_string()) {
        const std::string_view s = py_strip(v.get_ref<const std::string&>());
        Json inner = Json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
        if (!inner.is_discarded() && inner.is_object()) v = std::move(inner);
    }
    if (v.is_object()) return v;
    if (!v.is_string()) return std::nullopt;
    // A bare string: it belongs to the tool's one string parameter (its only required one, or its only one).
    const ToolParams& tp = opt.tool_params.at(tool);
    const auto strings = opt.string_args.find(tool);
    const auto is_string_prop = [&](const std::string& name) {
        return strings != opt.string_args.end() && strings->second.count(name) > 0;
    };
    std::optional<std::string> target;
    if (tp.required.size() == 1)
        target = *tp.required.begin();
    else if (tp.properties.size() == 1)
        target = tp.properties.front();
    if (!target || !is_string_prop(*target)) return std::nullopt;
    Json out = Json::object();
    out[*target] = std::move(v);
    return out;
}

}  // namespace

std::string dsml_arguments(const DsmlInvoke& invoke, const ParserOptions& opt, bool complete) {
    // The first value of each name, in order.
    std::vector<const DsmlParameter*> params;
    std::set<std::string> seen;
    for (const DsmlParameter& p : invoke.params)
        if (seen.insert(p.name).second) params.push_back(&p);

    if (complete) {
        if (params.size() == 1)
            if (auto repaired = unwrap(*params[0], opt, invoke.name)) return py_json_dumps(*repaired);
        std::string out = "{";
        for (size_t i = 0; i < params.size(); ++i) {
            if (i) out += ", ";
            out += json_string(params[i]->name) + ": " + py_json_dumps(typed_value(*params[i], opt, invoke.name));
        }
        return out + "}";
    }
    // Nothing is certain while the call may still turn out to be a wrapper (its first parameter is a candidate).
    if (params.empty() || may_be_wrapper(params[0]->name, opt, invoke.name)) return {};
    std::string out = "{";
    for (size_t i = 0; i < params.size(); ++i) {
        const DsmlParameter& p = *params[i];
        if (i) out += ", ";
        out += json_string(p.name) + ": ";
        if (p.closed) {
            out += py_json_dumps(typed_value(p, opt, invoke.name));
            continue;
        }
        // The open value: a string streams as it arrives; anything else is printed once it is complete.
        if (is_string_param(p, opt, invoke.name)) {
            out += '"';
            append_json_escaped(out, p.value);
        }
        break;
    }
    return out;
}

}  // namespace megactx::chat
