// Loading tokenizer.json / tokenizer_config.json, and encode / decode / streaming decode.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace megactx {

using json = nlohmann::json;

namespace tok {

void AddedTrie::add(std::string_view s, int32_t token_index) {
    if (s.empty()) return;
    first_[static_cast<unsigned char>(s[0])] = true;
    int32_t node = 0;
    for (char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        int32_t child = -1;
        for (const auto& [k, v] : nodes_[node].next) {
            if (k == c) child = v;
        }
        if (child < 0) {
            child = static_cast<int32_t>(nodes_.size());
            nodes_[node].next.push_back({c, child});
            nodes_.emplace_back();
        }
        node = child;
    }
    if (nodes_[node].token < 0) nodes_[node].token = token_index;
}

int32_t AddedTrie::longest(std::string_view text, size_t pos, size_t& end) const {
    int32_t found = -1, node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        int32_t child = -1;
        for (const auto& [k, v] : nodes_[node].next) {
            if (k == c) {
                child = v;
                break;
            }
        }
        if (child < 0) break;
        node = child;
        if (nodes_[node].token >= 0) {
            found = nodes_[node].token;
            end = i + 1;
        }
    }
    return found;
}

}  // namespace tok

namespace {

std::string read_file(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    MEGACTX_CHECK(in.good(), "{}: cannot open", p.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

json parse_json(std::string_view text, const std::string& origin) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        MEGACTX_FAIL("{}: not valid JSON: {}", origin, e.what());
    }
}

std::string type_of(const json& j, const std::string& where, const char* what) {
    MEGACTX_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "{}: {} without a 'type'", where,
                  what);
    return j["type"].get<std::string>();
}

void add_normalizer(const json& j, const std::string& where, std::vector<utf8::NormalForm>& out) {
    if (j.is_null()) return;
    const std::string t = type_of(j, where, "normalizer");
    if (t == "Sequence") {
        MEGACTX_CHECK(j.contains("normalizers") && j["normalizers"].is_array(),
                      "{}: normalizer Sequence without a 'normalizers' list", where);
        for (const auto& n : j["normalizers"]) add_normalizer(n, where, out);
    } else if (t == "NFC") {
        out.push_back(utf8::NormalForm::NFC);
    } else if (t == "NFD") {
        out.push_back(utf8::NormalForm::NFD);
    } else if (t == "NFKC") {
        out.push_back(utf8::NormalForm::NFKC);
    } else if (t == "NFKD") {
        out.push_back(utf8::NormalForm::NFKD);
    } else {
        MEGACTX_FAIL("{}: unsupported normalizer type '{}' (supported: NFC, NFD, NFKC, NFKD, Sequence)", where, t);
    }
}

struct DecoderFlags {
    bool byte_level = false, byte_fallback = false, any = false;
};

void add_decoder(const json& j, const std::string& where, DecoderFlags& f) {
    if (j.is_null()) return;
    const std::string t = type_of(j, where, "decoder");
    f.any = true;
    if (t == "Sequence") {
        MEGACTX_CHECK(j.contains("decoders") && j["decoders"].is_array(), "{}: decoder Sequence without 'decoders'",
                      where);
        for (const auto& d : j["decoders"]) add_decoder(d, where, f);
    } else if (t == "ByteLevel") {
        f.byte_level = true;
    } else if (t == "ByteFallback") {
        f.byte_fallback = true;
    } else if (t == "Fuse") {
        // Fuse joins the token strings, which decoding does anyway.
    } else {
        MEGACTX_FAIL("{}: unsupported decoder type '{}' (supported: ByteLevel, ByteFallback, Fuse, Sequence)", where, t);
    }
}

void add_post_processor(const json& j, const std::string& where, const Tokenizer::Impl& impl,
                        std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
    if (j.is_null()) return;
    const std::string t = type_of(j, where, "post_processor");
    if (t == "Sequence") {
        MEGACTX_CHECK(j.contains("processors") && j["processors"].is_array(),
                      "{}: post_processor Sequence without 'processors'", where);
        for (const auto& p : j["processors"]) add_post_processor(p, where, impl, prefix, suffix);
    } else if (t == "ByteLevel") {
        // Only adjusts offsets; ids are unchanged.
    } else if (t == "TemplateProcessing") {
        MEGACTX_CHECK(j.contains("single") && j["single"].is_array(),
                      "{}: post_processor TemplateProcessing without a 'single' template", where);
        const json specials = j.value("special_tokens", json::object());
        bool seen_a = false;
        for (const auto& item : j["single"]) {
            if (item.contains("Sequence")) {
                MEGACTX_CHECK(item["Sequence"].value("id", std::string()) == "A" && !seen_a,
                              "{}: TemplateProcessing single template may hold sequence A once: {}", where,
                              item.dump());
                seen_a = true;
            } else if (item.contains("SpecialToken")) {
                const std::string name = item["SpecialToken"].value("id", std::string());
                std::vector<int32_t> ids;
                if (specials.contains(name) && specials[name].contains("ids")) {
                    for (const auto& id : specials[name]["ids"]) {
                        MEGACTX_CHECK(id.is_number_integer(), "{}: TemplateProcessing special token '{}' has a bad id",
                                      where, name);
                        ids.push_back(id.get<int32_t>());
                    }
                } else {
                    int32_t id = -1;
                    if (const auto it = impl.added_by_content.find(name); it != impl.added_by_content.end()) {
                        id = impl.added[static_cast<size_t>(it->second)].id;
                    } else if (const auto v = impl.bpe.vocab.find(name); v != impl.bpe.vocab.end()) {
                        id = v->second;
                    }
                    MEGACTX_CHECK(id >= 0, "{}: TemplateProcessing special token '{}' is not in the vocabulary", where,
                                  name);
                    ids.push_back(id);
                }
                auto& dst = seen_a ? suffix : prefix;
                dst.insert(dst.end(), ids.begin(), ids.end());
            } else {
                MEGACTX_FAIL("{}: TemplateProcessing item is neither SpecialToken nor Sequence: {}", where, item.dump());
            }
        }
    } else {
        MEGACTX_FAIL("{}: unsupported post_processor type '{}' (supported: TemplateProcessing, ByteLevel, Sequence)",
                     where, t);
    }
}

// A tokenizer_config.json token entry: a string or {"content": ...}.
std::string config_token(const json& c, const char* key) {
    if (!c.contains(key)) return {};
    const json& v = c[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return {};
}

bool is_ws_at_end(std::string_view s, size_t end, size_t& start) {
    if (end == 0) return false;
    return utf8::is_white_space(utf8::prev_cp(s, end, start));
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
    namespace fs = std::filesystem;
    fs::path file = path;
    if (fs::is_directory(file)) file /= "tokenizer.json";
    MEGACTX_CHECK(fs::exists(file), "{}: no tokenizer.json there", path);
    const fs::path config = file.parent_path() / "tokenizer_config.json";
    const std::string config_text = fs::exists(config) ? read_file(config) : std::string();
    return from_json(read_file(file), config_text, file.string());
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               const std::string& origin) {
    auto impl = std::make_shared<Impl>();
    impl->origin = origin;
    const json j = parse_json(tokenizer_json, origin);
    MEGACTX_CHECK(j.is_object() && j.contains("model"), "{}: expected an object with a 'model'", origin);
    const json null;
    auto field = [&](const char* k) -> const json& { return j.contains(k) ? j[k] : null; };
    add_normalizer(field("normalizer"), origin, impl->normalizers);
    impl->pre.build(field("pre_tokenizer"), origin);
    impl->bpe.build(j["model"], origin);

    // Added tokens.
    const json& added = field("added_tokens");
    MEGACTX_CHECK(added.is_null() || added.is_array(), "{}: added_tokens must be a list", origin);
    if (added.is_array()) {
        for (size_t i = 0; i < added.size(); ++i) {
            const json& a = added[i];
            MEGACTX_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
                              a["id"].get<int64_t>() < INT32_MAX && a.contains("content") && a["content"].is_string(),
                          "{}: added_tokens[{}] needs an integer 'id' and a string 'content'", origin, i);
            tok::AddedToken t;
            t.id = a["id"].get<int32_t>();
            t.content = a["content"].get<std::string>();
            auto flag = [&](const char* k, bool d) { return a.contains(k) && a[k].is_boolean() ? a[k].get<bool>() : d; };
            t.special = flag("special", false);
            t.lstrip = flag("lstrip", false);
            t.rstrip = flag("rstrip", false);
            t.single_word = flag("single_word", false);
            t.normalized = flag("normalized", !t.special);
            impl->added.push_back(std::move(t));
        }
    }
    for (size_t i = 0; i < impl->added.size(); ++i) {
        const auto& t = impl->added[i];
        const auto idx = static_cast<int32_t>(i);
        impl->added_by_content.emplace(t.content, idx);
        if (t.normalized && !impl->normalizers.empty()) {
            std::string norm = t.content;
            for (auto f : impl->normalizers) norm = utf8::normalize(norm, f);
            impl->added_by_content.emplace(norm, idx);
            impl->norm_trie.add(norm, idx);
        } else {
            impl->raw_trie.add(t.content, idx);
        }
    }

    add_post_processor(field("post_processor"), origin, *impl, impl->prefix_ids, impl->suffix_ids);

    DecoderFlags dec;
    add_decoder(field("decoder"), origin, dec);
    impl->join_with_space = !dec.any;

    // Per-id tables for decoding.
    int32_t max_id = -1;
    for (const auto& [s, id] : impl->bpe.vocab) max_id = std::max(max_id, id);
    for (const auto& t : impl->added) max_id = std::max(max_id, t.id);
    const auto n = static_cast<size_t>(max_id + 1);
    impl->kind.assign(n, Impl::kAbsent);
    impl->id_str.assign(n, {});
    impl->id_bytes.assign(n, {});
    for (const auto& [s, id] : impl->bpe.vocab) {
        const auto i = static_cast<size_t>(id);
        impl->kind[i] = Impl::kVocab;
        impl->id_str[i] = s;
        std::string bytes;
        if (dec.byte_fallback && s.size() == 6 && s.starts_with("<0x") && s.back() == '>' &&
            std::isxdigit(static_cast<unsigned char>(s[3])) && std::isxdigit(static_cast<unsigned char>(s[4]))) {
            bytes += static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16));
        } else if (dec.byte_level) {
            // Characters outside the byte alphabet pass through as their own UTF-8.
            size_t k = 0;
            while (k < s.size()) {
                const size_t start = k;
                const int b = utf8::byte_of_unicode(utf8::next_cp(s, k));
                if (b >= 0) {
                    bytes += static_cast<char>(b);
                } else {
                    bytes.append(s, start, k - start);
                }
            }
        } else {
            bytes = s;
        }
        impl->id_bytes[i] = std::move(bytes);
    }
    for (const auto& t : impl->added) {
        const auto i = static_cast<size_t>(t.id);
        impl->kind[i] = t.special ? Impl::kSpecial : Impl::kAdded;
        impl->id_str[i] = t.content;
        impl->id_bytes[i] = t.content;
    }

    // tokenizer_config.json.
    if (!config_json.empty()) {
        const std::string cfg_origin =
            (std::filesystem::path(origin).parent_path() / "tokenizer_config.json").string();
        const json c = parse_json(config_json, cfg_origin);
        MEGACTX_CHECK(c.is_object(), "{}: expected a JSON object", cfg_origin);
        impl->bos_token = config_token(c, "bos_token");
        impl->eos_token = config_token(c, "eos_token");
        impl->pad_token = config_token(c, "pad_token");
        if (c.contains("chat_template")) {
            const json& ct = c["chat_template"];
            if (ct.is_string()) {
                impl->chat_template = ct.get<std::string>();
                impl->has_chat_template = true;
            } else if (ct.is_array()) {
                for (const auto& e : ct) {
                    if (e.is_object() && e.value("name", std::string()) == "default" && e.contains("template") &&
                        e["template"].is_string()) {
                        impl->chat_template = e["template"].get<std::string>();
                        impl->has_chat_template = true;
                    }
                }
            }
        }
    }
    Tokenizer t(impl);
    impl->bos_id = impl->bos_token.empty() ? -1 : t.token_id(impl->bos_token);
    impl->eos_id = impl->eos_token.empty() ? -1 : t.token_id(impl->eos_token);
    impl->pad_id = impl->pad_token.empty() ? -1 : t.token_id(impl->pad_token);
    return t;
}

void Tokenizer::Impl::check_id(int32_t id) const {
    MEGACTX_CHECK(id >= 0 && static_cast<size_t>(id) < kind.size() && kind[static_cast<size_t>(id)] != kAbsent,
                  "{}: token id {} is not in the vocabulary (size {})", origin, id, kind.size());
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out, std::deque<std::string>& scratch,
                                   std::vector<std::string_view>& pieces) const {
    pre.run(text, pieces, scratch);
    const bool bl = pre.byte_level();
    for (std::string_view p : pieces) bpe.encode(p, bl, out);
}

namespace {

struct Section {
    std::string_view text;
    int32_t token = -1;  // index into Impl::added, or -1 for plain text
};

// Cuts `text` at added-token matches (leftmost, then longest), honouring single_word, lstrip and rstrip.
void split_added(const Tokenizer::Impl& impl, const tok::AddedTrie& trie, std::string_view text,
                 std::vector<Section>& out) {
    out.clear();
    if (trie.empty()) {
        out.push_back({text, -1});
        return;
    }
    size_t plain_start = 0, i = 0;
    while (i < text.size()) {
        if (!trie.may_start(static_cast<unsigned char>(text[i]))) {
            ++i;
            continue;
        }
        size_t end = 0;
        const int32_t t = trie.longest(text, i, end);
        if (t < 0) {
            ++i;
            continue;
        }
        const tok::AddedToken& tok = impl.added[static_cast<size_t>(t)];
        if (tok.single_word) {
            size_t s = 0;
            const bool word_before = i > 0 && utf8::is_alphanumeric(utf8::prev_cp(text, i, s));
            size_t k = end;
            const bool word_after = end < text.size() && utf8::is_alphanumeric(utf8::next_cp(text, k));
            if (word_before || word_after) {
                i = end;  // the match is consumed but not used, as a non-overlapping scan does
                continue;
            }
        }
        size_t plain_end = i;
        if (tok.lstrip) {
            size_t s = 0;
            while (plain_end > plain_start && is_ws_at_end(text, plain_end, s)) plain_end = s;
        }
        if (plain_end > plain_start) out.push_back({text.substr(plain_start, plain_end - plain_start), -1});
        out.push_back({text.substr(i, end - i), t});
        i = end;
        if (tok.rstrip) {
            while (i < text.size()) {
                size_t k = i;
                if (!utf8::is_white_space(utf8::next_cp(text, k))) break;
                i = k;
            }
        }
        plain_start = i;
    }
    if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1});
}

}  // namespace

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
    std::deque<std::string> scratch;
    std::vector<std::string_view> pieces;
    std::vector<Section> sections, subsections;
    split_added(*this, raw_trie, text, sections);
    for (const Section& s : sections) {
        if (s.token >= 0) {
            out.push_back(added[static_cast<size_t>(s.token)].id);
            continue;
        }
        std::string_view plain = s.text;
        if (!normalizers.empty()) {
            std::string norm(plain);
            for (auto f : normalizers) norm = utf8::normalize(norm, f);
            scratch.push_back(std::move(norm));
            plain = scratch.back();
        }
        split_added(*this, norm_trie, plain, subsections);
        for (const Section& sub : subsections) {
            if (sub.token >= 0) {
                out.push_back(added[static_cast<size_t>(sub.token)].id);
            } else {
                encode_plain(sub.text, out, scratch, pieces);
            }
        }
    }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
    std::vector<int32_t> out;
    if (add_special_tokens) out = impl_->prefix_ids;
    if (utf8::is_valid(text)) {
        impl_->encode_text(text, out);
    } else {
        std::string clean;
        utf8::append_lossy(clean, text);
        impl_->encode_text(clean, out);
    }
    if (add_special_tokens) out.insert(out.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
    return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
    // Bytes of consecutive non-added tokens are decoded together; an added token's content is copied as is.
    std::string out, run;
    bool first = true;
    for (int32_t id : ids) {
        impl_->check_id(id);
        const auto k = impl_->kind[static_cast<size_t>(id)];
        if (k == Impl::kSpecial && skip_special_tokens) continue;
        if (impl_->join_with_space && !first) run += ' ';
        first = false;
        if (k == Impl::kVocab) {
            run += impl_->id_bytes[static_cast<size_t>(id)];
        } else {
            utf8::append_lossy(out, run);
            run.clear();
            out += impl_->id_bytes[static_cast<size_t>(id)];
        }
    }
    utf8::append_lossy(out, run);
    return out;
}

int32_t Tokenizer::token_id(std::string_view token) const {
    if (const auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) {
        return impl_->added[static_cast<size_t>(it->second)].id;
    }
    const auto it = impl_->bpe.vocab.find(token);
    return it == impl_->bpe.vocab.end() ? -1 : it->second;
}

std::string Tokenizer::token_str(int32_t id) const {
    impl_->check_id(id);
    return impl_->id_str[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
    impl_->check_id(id);
    return impl_->id_bytes[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < impl_->kind.size() && impl_->kind[static_cast<size_t>(id)] == Impl::kSpecial;
}

bool Tokenizer::is_added(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < impl_->kind.size() && impl_->kind[static_cast<size_t>(id)] >= Impl::kAdded;
}

size_t Tokenizer::vocab_size() const { return impl_->kind.size(); }
int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->eos_id; }
int32_t Tokenizer::pad_id() const { return impl_->pad_id; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::pad_token() const { return impl_->pad_token; }
bool Tokenizer::has_chat_template() const { return impl_->has_chat_template; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
    const Tokenizer::Impl& impl = tok_.impl();
    impl.check_id(id);
    const auto k = impl.kind[static_cast<size_t>(id)];
    std::string out;
    if (k == Tokenizer::Impl::kSpecial && skip_special_) return out;
    if (impl.join_with_space && !first_) pending_ += ' ';
    first_ = false;
    if (k == Tokenizer::Impl::kVocab) {
        pending_ += impl.id_bytes[static_cast<size_t>(id)];
        const size_t used = utf8::append_lossy(out, pending_, false);
        pending_.erase(0, used);
    } else {
        // An added token ends the byte run: what is pending can no longer complete.
        utf8::append_lossy(out, pending_);
        pending_.clear();
        out += impl.id_bytes[static_cast<size_t>(id)];
    }
    return out;
}

std::string StreamDecoder::flush() {
    std::string out;
    utf8::append_lossy(out, pending_);
    pending_.clear();
    return out;
}

}  // namespace megactx
