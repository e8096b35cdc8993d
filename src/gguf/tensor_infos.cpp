// Tensor info parsing and placement of tensor data inside the file.
#include <algorithm>
#include <numeric>

#include "parse.h"

namespace activekv::gguf::detail {

namespace {

/// Reads n_dims and the dims; rejects n_dims outside 1..4, zero dims and a
/// product of dims that overflows uint64. Sets dims and n_elements.
void parse_dims(Reader& r, const std::string& prefix, TensorInfo& t) {
  const uint64_t n_dims_at = r.pos();
  const uint32_t n_dims = r.u32(prefix + ".n_dims");
  if (n_dims == 0 || n_dims > kMaxDims) {
    r.fail(prefix + ".n_dims", n_dims_at,
           "tensor " + quoted(t.name) + " has n_dims " + std::to_string(n_dims) +
               " (must be 1.." + std::to_string(kMaxDims) + ")");
  }
  t.dims.resize(n_dims);
  t.n_elements = 1;
  const std::string dims_field = prefix + ".dims";
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t at = r.pos();
    const uint64_t dim = r.u64(FieldRef(dims_field, d));
    if (dim == 0) {
      r.fail(FieldRef(dims_field, d), at, "tensor " + quoted(t.name) + " has a zero-size dim");
    }
    if (__builtin_mul_overflow(t.n_elements, dim, &t.n_elements)) {
      r.fail(FieldRef(dims_field, d), at,
             "tensor " + quoted(t.name) + " product of dims overflows uint64");
    }
    t.dims[d] = dim;
  }
}

/// Reads the type id, rejecting ids we cannot lay out, and computes n_bytes:
/// rows of dims[0] elements, each a whole number of blocks.
void parse_type(Reader& r, const std::string& prefix, TensorInfo& t) {
  const std::string field = prefix + ".type";
  const uint64_t at = r.pos();
  const uint32_t id = r.u32(field);
  t.type = static_cast<TensorType>(id);
  if (!is_supported(t.type)) {
    r.fail(field, at,
           "tensor " + quoted(t.name) + " has unknown or unsupported type id " + std::to_string(id));
  }
  const uint64_t be = block_elements(t.type);
  if (t.dims[0] % be != 0) {
    r.fail(field, at,
           "tensor " + quoted(t.name) + " row length " + std::to_string(t.dims[0]) +
               " is not a multiple of the " + type_name(t.type) + " block size " +
               std::to_string(be));
  }
  const uint64_t blocks = t.n_elements / be;
  if (__builtin_mul_overflow(blocks, uint64_t{block_bytes(t.type)}, &t.n_bytes)) {
    r.fail(field, at, "tensor " + quoted(t.name) + " byte size overflows uint64");
  }
}

TensorInfo parse_one(Reader& r, uint64_t i, uint64_t& offset_field) {
  const std::string prefix = "tensor_infos[" + std::to_string(i) + "]";
  TensorInfo t;
  const uint64_t name_at = r.pos();
  t.name = r.string(prefix + ".name");
  check_tensor_name(r, t.name, name_at, prefix + ".name");
  parse_dims(r, prefix, t);
  parse_type(r, prefix, t);
  offset_field = r.pos();
  t.offset = r.u64(prefix + ".offset");  // relative until place_tensors
  return t;
}

/// Tensors are placed (absolute offsets, extents inside the file, each
/// n_bytes > 0). Each tensor's data must be its own: gguf.md gives each tensor
/// a range of tensor_data, and two tensors sharing bytes is a corrupt (or
/// hostile) file. Sorted by offset, each range must start at or after the end
/// of the one before; the error names the later tensor's offset field.
void check_no_overlap(const Reader& r, const std::vector<TensorInfo>& tensors,
                      const std::vector<uint64_t>& offset_fields) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = tensors[order[k - 1]];
    const TensorInfo& t = tensors[order[k]];
    if (t.offset < prev.offset + prev.n_bytes) {
      r.fail("tensor_infos[" + std::to_string(order[k]) + "].offset", offset_fields[order[k]],
             "tensor " + quoted(t.name) + " data [" + std::to_string(t.offset) + ", " +
                 std::to_string(t.offset + t.n_bytes) + ") overlaps tensor " + quoted(prev.name) +
                 " data [" + std::to_string(prev.offset) + ", " +
                 std::to_string(prev.offset + prev.n_bytes) + ")");
    }
  }
}

}  // namespace

std::vector<TensorInfo> parse_tensor_infos(Reader& r, uint64_t tensor_count, NameIndex& index,
                                           std::vector<uint64_t>& offset_fields) {
  std::vector<TensorInfo> tensors;
  tensors.reserve(tensor_count);  // bounded by parse_header against the file size
  offset_fields.assign(tensor_count, 0);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    const uint64_t name_at = r.pos();
    TensorInfo t = parse_one(r, i, offset_fields[i]);
    if (!index.emplace(t.name, tensors.size()).second) {
      r.fail("tensor_infos[" + std::to_string(i) + "].name", name_at,
             "duplicate tensor name " + quoted(t.name));
    }
    tensors.push_back(std::move(t));
  }
  return tensors;
}

uint64_t place_tensors(const Reader& r, uint64_t alignment, std::vector<TensorInfo>& tensors,
                       const std::vector<uint64_t>& offset_fields) {
  // alignment is a power of two, so rounding up is a mask; check the add.
  uint64_t data_offset = 0;
  if (__builtin_add_overflow(r.pos(), alignment - 1, &data_offset)) {
    r.fail("kv['general.alignment']", r.pos(), "data section offset overflows");
  }
  data_offset &= ~(alignment - 1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorInfo& t = tensors[i];
    const std::string field = "tensor_infos[" + std::to_string(i) + "].offset";
    const uint64_t rel = t.offset;
    uint64_t begin = 0, end = 0;
    if (rel % alignment != 0) {
      r.fail(field, offset_fields[i],
             "tensor " + quoted(t.name) + " offset " + std::to_string(rel) +
                 " is not a multiple of the alignment " + std::to_string(alignment));
    }
    if (__builtin_add_overflow(data_offset, rel, &begin) ||
        __builtin_add_overflow(begin, t.n_bytes, &end) || end > r.size()) {
      r.fail(field, offset_fields[i],
             "tensor " + quoted(t.name) + " data extent [" + std::to_string(data_offset) + "+" +
                 std::to_string(rel) + ", +" + std::to_string(t.n_bytes) +
                 ") exceeds file size " + std::to_string(r.size()) + " (truncated or corrupt)");
    }
    t.offset = begin;
    t.data = r.data() + begin;
  }
  check_no_overlap(r, tensors, offset_fields);
  return data_offset;
}

}  // namespace activekv::gguf::detail
