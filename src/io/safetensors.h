// Safetensors checkpoints, memory-mapped: one `model.safetensors` or shards listed in
// `model.safetensors.index.json` (Hugging Face layout). Every header is validated when the file is opened
// (length, JSON, dtypes, shapes, offsets inside the file), so a bad file is one clear Error naming it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megactx {

struct TensorInfo {
    std::string name;
    std::string file;          // the file it came from, for error messages
    std::string dtype_name;    // as written in the header
    bool dtype_known = false;  // false: a dtype megactx does not read (an error only if the tensor is used)
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    const uint8_t* data = nullptr;  // points into the mapping; no alignment guarantee
    size_t nbytes = 0;

    int64_t numel() const;
    std::string shape_str() const;
};

// One mapped .safetensors file.
class SafetensorsFile {
public:
    explicit SafetensorsFile(const std::string& path);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
    const std::string& path() const { return path_; }

    // Validates a complete file image (header + data) and returns its tensors; `data` must outlive them.
    // Used by the constructor and by the fuzz target.
    static std::map<std::string, TensorInfo> parse(const uint8_t* data, size_t size, const std::string& source);

private:
    std::string path_;
    void* map_ = nullptr;
    size_t size_ = 0;
    std::map<std::string, TensorInfo> tensors_;
};

// All tensors of a model directory, by name.
class TensorStore {
public:
    explicit TensorStore(const std::string& model_dir);
    // Tensors held in memory (synthetic weights, model/synthetic_weights.h): their data points into memory that
    // `keep` owns. `label` stands for the directory in messages.
    TensorStore(std::string label, std::map<std::string, TensorInfo> tensors, std::shared_ptr<const void> keep);

    bool has(const std::string& name) const { return index_.count(name) != 0; }
    // The tensor, checked to exist and to have a dtype megactx reads; errors name the tensor and file.
    const TensorInfo& get(const std::string& name) const;
    // Same, also checking the shape.
    const TensorInfo& get(const std::string& name, const std::vector<int64_t>& shape) const;
    std::vector<std::string> names() const;
    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, const TensorInfo*> index_;
    std::map<std::string, TensorInfo> memory_;  // the in-memory constructor's tensors
    std::shared_ptr<const void> keep_;
};

struct TensorToWrite {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

// Writes a .safetensors file (header padded to 8 bytes); written to a temporary name and renamed, so a
// failure leaves no partial file.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace megactx
