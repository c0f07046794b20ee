#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"

namespace megactx {

using json = nlohmann::json;

int64_t TensorInfo::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string TensorInfo::shape_str() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

static std::string shape_to_str(const std::vector<int64_t>& shape) {
    TensorInfo t;
    t.shape = shape;
    return t.shape_str();
}

std::map<std::string, TensorInfo> SafetensorsFile::parse(const uint8_t* data, size_t size, const std::string& source) {
    MEGACTX_CHECK(size >= 8, "{}: truncated safetensors file ({} bytes; the 8-byte header length is missing)", source,
                  size);
    uint64_t header_len = 0;
    for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(data[i]) << (8 * i);
    MEGACTX_CHECK(header_len <= size - 8, "{}: safetensors header length {} runs past the end of the file ({} bytes)",
                  source, header_len, size);
    json header;
    try {
        header = json::parse(data + 8, data + 8 + header_len);
    } catch (const json::exception& e) {
        MEGACTX_FAIL("{}: safetensors header is not valid JSON: {}", source, e.what());
    }
    MEGACTX_CHECK(header.is_object(), "{}: safetensors header must be a JSON object", source);

    const uint8_t* base = data + 8 + header_len;
    const uint64_t data_size = size - 8 - header_len;
    std::map<std::string, TensorInfo> tensors;
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") continue;
        MEGACTX_CHECK(entry.is_object(), "{}: tensor '{}': header entry must be an object", source, name);
        TensorInfo t;
        t.name = name;
        t.file = source;
        const auto dt = entry.find("dtype");
        MEGACTX_CHECK(dt != entry.end() && dt->is_string(), "{}: tensor '{}': missing string field 'dtype'", source,
                      name);
        t.dtype_name = dt->get<std::string>();
        t.dtype_known = parse_dtype(t.dtype_name, &t.dtype);

        const auto sh = entry.find("shape");
        MEGACTX_CHECK(sh != entry.end() && sh->is_array(), "{}: tensor '{}': missing array field 'shape'", source,
                      name);
        // Every prefix product stays below 2^48 (checked before multiplying, so it cannot wrap), which keeps
        // TensorInfo::numel() and the byte counts below well inside 64 bits.
        constexpr uint64_t kMaxNumel = uint64_t{1} << 48;
        uint64_t numel = 1;
        for (const auto& d : *sh) {
            MEGACTX_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() < (int64_t{1} << 40),
                          "{}: tensor '{}': shape entries must be non-negative integers", source, name);
            t.shape.push_back(d.get<int64_t>());
            const auto dim = static_cast<uint64_t>(t.shape.back());
            MEGACTX_CHECK(dim == 0 || numel < kMaxNumel / dim, "{}: tensor '{}': shape {} is too large", source, name,
                          sh->dump());
            numel *= dim;
        }

        const auto off = entry.find("data_offsets");
        MEGACTX_CHECK(off != entry.end() && off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() &&
                          (*off)[1].is_number_unsigned(),
                      "{}: tensor '{}': 'data_offsets' must be two non-negative integers", source, name);
        const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
        MEGACTX_CHECK(begin <= end && end <= data_size,
                      "{}: tensor '{}': data_offsets [{}, {}] out of range (the data section has {} bytes; the file "
                      "is truncated or corrupt)",
                      source, name, begin, end, data_size);
        if (t.dtype_known) {
            const uint64_t expect = numel * dtype_size(t.dtype);
            MEGACTX_CHECK(end - begin == expect,
                          "{}: tensor '{}': {} {} needs {} bytes but data_offsets span {} bytes", source, name,
                          t.dtype_name, t.shape_str(), expect, end - begin);
        }
        t.data = base + begin;
        t.nbytes = end - begin;
        tensors.emplace(name, std::move(t));
    }
    return tensors;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    MEGACTX_CHECK(fd >= 0, "{}: cannot open safetensors file", path);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        ::close(fd);
        MEGACTX_FAIL("{}: cannot stat safetensors file", path);
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
        map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        ::close(fd);
        if (map_ == MAP_FAILED) {
            map_ = nullptr;
            MEGACTX_FAIL("{}: mmap failed", path);
        }
    } else {
        ::close(fd);
    }
    try {
        tensors_ = parse(static_cast<const uint8_t*>(map_), size_, path);
    } catch (...) {
        if (map_) ::munmap(map_, size_);
        map_ = nullptr;
        throw;
    }
}

SafetensorsFile::~SafetensorsFile() {
    if (map_) ::munmap(map_, size_);
}

TensorStore::TensorStore(std::string label, std::map<std::string, TensorInfo> tensors, std::shared_ptr<const void> keep)
    : dir_(std::move(label)), memory_(std::move(tensors)), keep_(std::move(keep)) {
    for (const auto& [name, t] : memory_) index_[name] = &t;
}

TensorStore::TensorStore(const std::string& model_dir) : dir_(model_dir) {
    namespace fs = std::filesystem;
    MEGACTX_CHECK(fs::is_directory(model_dir), "{}: model directory does not exist", model_dir);
    const fs::path single = fs::path(model_dir) / "model.safetensors";
    const fs::path index = fs::path(model_dir) / "model.safetensors.index.json";
    if (fs::exists(index)) {
        json j;
        try {
            std::ifstream in(index);
            j = json::parse(in);
        } catch (const json::exception& e) {
            MEGACTX_FAIL("{}: not valid JSON: {}", index.string(), e.what());
        }
        MEGACTX_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                      "{}: missing object field 'weight_map'", index.string());
        std::map<std::string, SafetensorsFile*> opened;
        for (const auto& [name, file] : j["weight_map"].items()) {
            MEGACTX_CHECK(file.is_string(), "{}: weight_map['{}'] must be a file name", index.string(), name);
            const std::string shard = file.get<std::string>();
            MEGACTX_CHECK(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(),
                          "{}: weight_map['{}'] names '{}', which is not a file in the model directory",
                          index.string(), name, shard);
            auto it = opened.find(shard);
            if (it == opened.end()) {
                files_.push_back(std::make_unique<SafetensorsFile>((fs::path(model_dir) / shard).string()));
                it = opened.emplace(shard, files_.back().get()).first;
            }
            const auto& ts = it->second->tensors();
            const auto t = ts.find(name);
            MEGACTX_CHECK(t != ts.end(), "{}: tensor '{}' is listed in {} but missing from the shard",
                          it->second->path(), name, index.string());
            index_[name] = &t->second;
        }
    } else if (fs::exists(single)) {
        files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
        for (const auto& [name, t] : files_.back()->tensors()) index_[name] = &t;
    } else {
        MEGACTX_FAIL("{}: no model.safetensors or model.safetensors.index.json", model_dir);
    }
}

const TensorInfo& TensorStore::get(const std::string& name) const {
    const auto it = index_.find(name);
    MEGACTX_CHECK(it != index_.end(), "{}: missing tensor '{}'", dir_, name);
    const TensorInfo& t = *it->second;
    MEGACTX_CHECK(t.dtype_known, "{}: tensor '{}' has unsupported dtype {} (megactx reads F32, BF16, F16, F8_E4M3)",
                  t.file, name, t.dtype_name);
    return t;
}

const TensorInfo& TensorStore::get(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorInfo& t = get(name);
    MEGACTX_CHECK(t.shape == shape, "{}: tensor '{}' has shape {}, expected {}", t.file, name, t.shape_str(),
                  shape_to_str(shape));
    return t;
}

std::vector<std::string> TensorStore::names() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : index_) out.push_back(name);
    return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
    json header = json::object();
    uint64_t offset = 0;
    for (const auto& t : tensors) {
        header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
        offset += t.bytes.size();
    }
    std::string h = header.dump();
    while (h.size() % 8) h.push_back(' ');
    write_file_atomically(path, [&](std::ostream& out) {
        const uint64_t n = h.size();
        uint8_t len[8];
        for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
        out.write(reinterpret_cast<const char*>(len), 8);
        out.write(h.data(), static_cast<std::streamsize>(h.size()));
        for (const auto& t : tensors) {
            out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
        }
    });
}

}  // namespace megactx
