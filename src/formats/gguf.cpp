// formats/gguf.cpp — bounds-checked GGUF reader and a v3 writer.
#include "formats/gguf.h"

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace fp {

namespace {

// ggml's names for the tensor types fastpath does not read (the i-quants, ternary and FP4
// formats, Q8_1/Q8_K), so the error says what the file holds.
std::string gguf_type_label(uint32_t g) {
  static const std::pair<uint32_t, const char*> kOthers[] = {
      {9, "Q8_1"},     {15, "Q8_K"},  {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"}, {19, "IQ1_S"},
      {20, "IQ4_NL"},  {21, "IQ3_S"}, {22, "IQ2_S"},   {23, "IQ4_XS"}, {29, "IQ1_M"},   {34, "TQ1_0"},
      {35, "TQ2_0"},   {39, "MXFP4"}, {40, "NVFP4"},   {41, "Q1_0"}};
  for (const auto& [id, name] : kOthers)
    if (id == g) return std::to_string(g) + " (" + name + ")";
  return std::to_string(g);
}

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxStringLen = uint64_t{1} << 30;
constexpr uint64_t kMaxArrayLen = uint64_t{1} << 32;
constexpr uint64_t kMaxDims = 4;
constexpr int kMaxNesting = 8;

// A cursor over the mapped bytes; every read checks the remaining length.
class Reader {
 public:
  Reader(const uint8_t* d, size_t n, const std::string& name) : d_(d), n_(n), name_(name) {}
  size_t pos() const { return pos_; }
  void need(uint64_t k, const char* what) {
    if (k > n_ - pos_)
      fail(name_, ": truncated file: reading ", what, " needs ", k, " bytes at offset ", pos_, " but the file has ",
           n_, " bytes");
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, d_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    uint64_t len = read<uint64_t>(what);
    if (len > kMaxStringLen) fail(name_, ": ", what, ": string length ", len, " is implausible (corrupt file?)");
    need(len, what);
    std::string s(reinterpret_cast<const char*>(d_ + pos_), len);
    pos_ += len;
    return s;
  }
  const std::string& name() const { return name_; }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& name_;
};

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    default: return 0;
  }
}

void read_scalar(Reader& r, GgufType t, GgufValue& v, const std::string& key) {
  switch (t) {
    case GgufType::U8: v.u = r.read<uint8_t>("u8"); v.i = static_cast<int64_t>(v.u); v.f = static_cast<double>(v.u); break;
    case GgufType::I8: v.i = r.read<int8_t>("i8"); v.f = static_cast<double>(v.i); break;
    case GgufType::U16: v.u = r.read<uint16_t>("u16"); v.i = static_cast<int64_t>(v.u); v.f = static_cast<double>(v.u); break;
    case GgufType::I16: v.i = r.read<int16_t>("i16"); v.f = static_cast<double>(v.i); break;
    case GgufType::U32: v.u = r.read<uint32_t>("u32"); v.i = static_cast<int64_t>(v.u); v.f = static_cast<double>(v.u); break;
    case GgufType::I32: v.i = r.read<int32_t>("i32"); v.f = static_cast<double>(v.i); break;
    case GgufType::U64: v.u = r.read<uint64_t>("u64"); v.i = static_cast<int64_t>(v.u); v.f = static_cast<double>(v.u); break;
    case GgufType::I64: v.i = r.read<int64_t>("i64"); v.f = static_cast<double>(v.i); break;
    case GgufType::F32: v.f = r.read<float>("f32"); break;
    case GgufType::F64: v.f = r.read<double>("f64"); break;
    case GgufType::BOOL: {
      uint8_t b = r.read<uint8_t>("bool");
      if (b > 1) fail(r.name(), ": metadata key '", key, "': bool value ", int(b), " is neither 0 nor 1");
      v.b = b != 0;
      v.f = b;
      break;
    }
    case GgufType::STRING: v.s = r.read_string("string value"); break;
    default: fail(r.name(), ": metadata key '", key, "': unknown value type ", static_cast<uint32_t>(t));
  }
  // Signed integers also expose a non-negative value through u, so get_uint works on them.
  if ((t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64) && v.i >= 0)
    v.u = static_cast<uint64_t>(v.i);
}

void read_value(Reader& r, GgufType t, GgufValue& v, const std::string& key, int depth) {
  v.type = t;
  if (t != GgufType::ARRAY) {
    read_scalar(r, t, v, key);
    return;
  }
  if (depth >= kMaxNesting) fail(r.name(), ": metadata key '", key, "': arrays nested deeper than ", kMaxNesting);
  uint32_t et = r.read<uint32_t>("array element type");
  if (et > static_cast<uint32_t>(GgufType::F64))
    fail(r.name(), ": metadata key '", key, "': unknown array element type ", et);
  v.elem_type = static_cast<GgufType>(et);
  uint64_t len = r.read<uint64_t>("array length");
  if (len > kMaxArrayLen) fail(r.name(), ": metadata key '", key, "': array length ", len, " is implausible");
  v.arr_len = len;
  if (v.elem_type == GgufType::STRING) {
    r.need(len * 8, "string array");  // each string has at least its 8-byte length
    v.arr_str.reserve(len);
    for (uint64_t k = 0; k < len; ++k) v.arr_str.push_back(r.read_string("string array element"));
  } else if (v.elem_type == GgufType::ARRAY) {
    r.need(len * 12, "nested array");
    v.arr_nested.resize(len);
    for (uint64_t k = 0; k < len; ++k) read_value(r, GgufType::ARRAY, v.arr_nested[k], key, depth + 1);
  } else {
    r.need(len * scalar_size(v.elem_type), "numeric array");
    v.arr_num.reserve(len);
    GgufValue tmp;
    for (uint64_t k = 0; k < len; ++k) {
      read_scalar(r, v.elem_type, tmp, key);
      v.arr_num.push_back(v.elem_type == GgufType::BOOL ? (tmp.b ? 1.0 : 0.0) : tmp.f);
    }
  }
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16: case GgufType::U32:
    case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}

std::string GgufValue::to_string(size_t max_items) const {
  std::ostringstream os;
  switch (type) {
    case GgufType::STRING: {
      std::string str = s.size() > 80 ? s.substr(0, 77) + "..." : s;
      for (auto& c : str) if (c == '\n') c = ' ';
      os << '\'' << str << '\'';
      break;
    }
    case GgufType::BOOL: os << (b ? "true" : "false"); break;
    case GgufType::F32: case GgufType::F64: os << f; break;
    case GgufType::ARRAY: {
      os << '[' << gguf_type_name(elem_type) << " x " << arr_len << ']';
      if (max_items > 0 && arr_len > 0) {
        os << " {";
        for (size_t k = 0; k < std::min<uint64_t>(arr_len, max_items); ++k) {
          if (k) os << ", ";
          if (!arr_str.empty()) os << '\'' << arr_str[k] << '\'';
          else if (!arr_num.empty()) os << arr_num[k];
          else os << "[...]";
        }
        if (arr_len > max_items) os << ", ...";
        os << '}';
      }
      break;
    }
    default:
      if (type == GgufType::I8 || type == GgufType::I16 || type == GgufType::I32 || type == GgufType::I64) os << i;
      else os << u;
  }
  return os.str();
}

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  auto mf = MappedFile::open(path);
  auto g = parse(mf->data(), mf->size(), path);
  g->file_ = std::move(mf);
  return g;
}

std::unique_ptr<GgufFile> GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GgufFile> g(new GgufFile());
  g->name_ = name;
  g->data_ = data;
  g->size_ = size;
  g->parse_all();
  return g;
}

void GgufFile::parse_all() {
  Reader r(data_, size_, name_);
  uint32_t magic = r.read<uint32_t>("magic");
  if (magic != kMagic) fail(name_, ": not a GGUF file (bad magic 0x", std::hex, magic, ", expected 0x", kMagic, ")");
  version_ = r.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) fail(name_, ": unsupported GGUF version ", version_, " (expected 2 or 3)");
  uint64_t n_tensors = r.read<uint64_t>("tensor count");
  uint64_t n_kv = r.read<uint64_t>("metadata count");
  // Each kv needs >= 8+4 bytes and each tensor info >= 8+4+4+8 bytes; reject counts the file cannot hold.
  if (n_kv > size_ / 12) fail(name_, ": metadata count ", n_kv, " cannot fit in a file of ", size_, " bytes");
  if (n_tensors > size_ / 24) fail(name_, ": tensor count ", n_tensors, " cannot fit in a file of ", size_, " bytes");

  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.read_string("metadata key");
    uint32_t t = r.read<uint32_t>("metadata value type");
    if (t > static_cast<uint32_t>(GgufType::F64)) fail(name_, ": metadata key '", key, "': unknown value type ", t);
    GgufValue v;
    read_value(r, static_cast<GgufType>(t), v, key, 0);
    if (kv_index_.count(key)) fail(name_, ": duplicate metadata key '", key, "'");
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    // The spec asks for a multiple of 8; smaller ones would let tensor data sit at addresses too odd
    // for its element type (misaligned f16/f32/block loads).
    if (!a->is_integer() || a->u < 8 || (a->u & (a->u - 1)) != 0 || a->u > 65536)
      fail(name_, ": general.alignment must be a power of two from 8 to 65536, got ", a->to_string());
    alignment_ = a->u;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo ti;
    ti.name = r.read_string("tensor name");
    uint32_t nd = r.read<uint32_t>("tensor dimension count");
    if (nd == 0 || nd > kMaxDims) fail(name_, ": tensor '", ti.name, "': ", nd, " dimensions (expected 1..", kMaxDims, ")");
    for (uint32_t d = 0; d < nd; ++d) {
      int64_t ne = r.read<int64_t>("tensor dimension");
      if (ne < 0) fail(name_, ": tensor '", ti.name, "': negative dimension ", ne);
      ti.ne.push_back(ne);
    }
    uint32_t gt = r.read<uint32_t>("tensor type");
    if (!dtype_from_gguf(gt, &ti.type))
      fail(name_, ": tensor '", ti.name, "': unsupported tensor type ", gguf_type_label(gt),
           "; fastpath reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS");
    ti.offset = r.read<uint64_t>("tensor offset");
    if (ti.offset % alignment_ != 0)
      fail(name_, ": tensor '", ti.name, "': offset ", ti.offset, " is not a multiple of the alignment ", alignment_);
    const auto& info = dtype_info(ti.type);
    if (ti.ne[0] % info.block_elems != 0)
      fail(name_, ": tensor '", ti.name, "': first dimension ", ti.ne[0], " is not a multiple of the ", info.name,
           " block size ", info.block_elems);
    uint64_t bytes = static_cast<uint64_t>(ti.ne[0] / info.block_elems) , tmp;
    if (mul_overflows(bytes, static_cast<uint64_t>(info.block_bytes), &bytes))
      fail(name_, ": tensor '", ti.name, "': size overflows");
    for (size_t d = 1; d < ti.ne.size(); ++d) {
      if (mul_overflows(bytes, static_cast<uint64_t>(ti.ne[d]), &tmp)) fail(name_, ": tensor '", ti.name, "': size overflows");
      bytes = tmp;
    }
    // Tensor views multiply the dims in other orders (outermost first, or skipping a 0 dim): keep the
    // product of the dims with 0 counted as 1, times the block size, within int64.
    uint64_t span = static_cast<uint64_t>(info.block_bytes);
    for (auto d : ti.ne)
      if (mul_overflows(span, std::max<uint64_t>(static_cast<uint64_t>(d), 1), &span) ||
          span > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(name_, ": tensor '", ti.name, "': size overflows");
    ti.nbytes = bytes;
    if (tensor_index_.count(ti.name)) fail(name_, ": duplicate tensor name '", ti.name, "'");
    tensor_index_[ti.name] = tensors_.size();
    tensors_.push_back(std::move(ti));
  }

  data_offset_ = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_offset_ > size_ && !tensors_.empty())
    fail(name_, ": truncated file: the tensor data section starts at ", data_offset_, " but the file has ", size_, " bytes");
  for (auto& ti : tensors_) {
    uint64_t end;
    if (__builtin_add_overflow(data_offset_, ti.offset, &end) || __builtin_add_overflow(end, ti.nbytes, &end) ||
        end > size_)
      fail(name_, ": tensor '", ti.name, "' (", dtype_name(ti.type), ", ", ti.nbytes, " bytes at data offset ", ti.offset,
           ") points past the end of the file (", size_, " bytes): truncated or corrupt");
    ti.data = data_ + data_offset_ + ti.offset;
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  FP_CHECK(v, name_, ": missing metadata key '", key, "'");
  FP_CHECK(v->type == GgufType::STRING, name_, ": metadata key '", key, "' should be a string, found ", gguf_type_name(v->type));
  return v->s;
}
std::string GgufFile::get_string(const std::string& key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}
uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue* v = find(key);
  FP_CHECK(v, name_, ": missing metadata key '", key, "'");
  FP_CHECK(v->is_integer(), name_, ": metadata key '", key, "' should be an integer, found ", gguf_type_name(v->type));
  FP_CHECK(v->i >= 0 || v->type == GgufType::U64, name_, ": metadata key '", key, "' is negative: ", v->i);
  return v->u;
}
uint64_t GgufFile::get_uint(const std::string& key, uint64_t def) const { return has(key) ? get_uint(key) : def; }
double GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  FP_CHECK(v, name_, ": missing metadata key '", key, "'");
  FP_CHECK(v->is_number(), name_, ": metadata key '", key, "' should be a number, found ", gguf_type_name(v->type));
  return v->f;
}
double GgufFile::get_float(const std::string& key, double def) const { return has(key) ? get_float(key) : def; }
bool GgufFile::get_bool(const std::string& key, bool def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  FP_CHECK(v->type == GgufType::BOOL, name_, ": metadata key '", key, "' should be a bool, found ", gguf_type_name(v->type));
  return v->b;
}
const std::vector<std::string>* GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  FP_CHECK(v->type == GgufType::ARRAY && v->elem_type == GgufType::STRING, name_, ": metadata key '", key,
           "' should be an array of strings, found ", v->to_string(0));
  return &v->arr_str;
}
const std::vector<double>* GgufFile::get_number_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  FP_CHECK(v->type == GgufType::ARRAY && v->elem_type != GgufType::STRING && v->elem_type != GgufType::ARRAY, name_,
           ": metadata key '", key, "' should be a numeric array, found ", v->to_string(0));
  return &v->arr_num;
}

// ---- writer -------------------------------------------------------------------------

namespace {
template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}
void put_str(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
std::vector<uint8_t> encoded(GgufType t) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, static_cast<uint32_t>(t));
  return b;
}
}  // namespace

void GgufWriter::set_string(const std::string& k, const std::string& v) { auto b = encoded(GgufType::STRING); put_str(b, v); kv_.emplace_back(k, b); }
void GgufWriter::set_u32(const std::string& k, uint32_t v) { auto b = encoded(GgufType::U32); put(b, v); kv_.emplace_back(k, b); }
void GgufWriter::set_i32(const std::string& k, int32_t v) { auto b = encoded(GgufType::I32); put(b, v); kv_.emplace_back(k, b); }
void GgufWriter::set_u64(const std::string& k, uint64_t v) { auto b = encoded(GgufType::U64); put(b, v); kv_.emplace_back(k, b); }
void GgufWriter::set_f32(const std::string& k, float v) { auto b = encoded(GgufType::F32); put(b, v); kv_.emplace_back(k, b); }
void GgufWriter::set_bool(const std::string& k, bool v) { auto b = encoded(GgufType::BOOL); put<uint8_t>(b, v ? 1 : 0); kv_.emplace_back(k, b); }
void GgufWriter::set_string_array(const std::string& k, const std::vector<std::string>& v) {
  auto b = encoded(GgufType::ARRAY);
  put<uint32_t>(b, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(b, v.size());
  for (auto& s : v) put_str(b, s);
  kv_.emplace_back(k, b);
}
void GgufWriter::set_f32_array(const std::string& k, const std::vector<float>& v) {
  auto b = encoded(GgufType::ARRAY);
  put<uint32_t>(b, static_cast<uint32_t>(GgufType::F32));
  put<uint64_t>(b, v.size());
  for (float x : v) put(b, x);
  kv_.emplace_back(k, b);
}
void GgufWriter::set_i32_array(const std::string& k, const std::vector<int32_t>& v) {
  auto b = encoded(GgufType::ARRAY);
  put<uint32_t>(b, static_cast<uint32_t>(GgufType::I32));
  put<uint64_t>(b, v.size());
  for (int32_t x : v) put(b, x);
  kv_.emplace_back(k, b);
}
void GgufWriter::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne, std::vector<uint8_t> data) {
  FP_CHECK(!ne.empty() && ne.size() <= 4, "gguf writer: tensor '", name, "' needs 1..4 dims");
  FP_CHECK(type != DType::F8_E4M3, "gguf writer: tensor '", name, "': GGUF has no FP8 type");
  int64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
  FP_CHECK(static_cast<int64_t>(data.size()) == row_bytes(type, ne[0]) * rows, "gguf writer: tensor '", name,
           "' has ", data.size(), " bytes, expected ", row_bytes(type, ne[0]) * rows);
  tensors_.push_back({name, type, ne, std::move(data)});
}

std::vector<uint8_t> GgufWriter::to_bytes(uint32_t alignment) const {
  std::vector<uint8_t> b;
  put<uint32_t>(b, kMagic);
  put<uint32_t>(b, 3);
  put<uint64_t>(b, tensors_.size());
  bool has_align = alignment != 32;
  put<uint64_t>(b, kv_.size() + (has_align ? 1 : 0));
  if (has_align) {
    put_str(b, "general.alignment");
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::U32));
    put<uint32_t>(b, alignment);
  }
  for (auto& [k, v] : kv_) {
    put_str(b, k);
    b.insert(b.end(), v.begin(), v.end());
  }
  uint64_t off = 0;
  for (auto& t : tensors_) {
    put_str(b, t.name);
    put<uint32_t>(b, static_cast<uint32_t>(t.ne.size()));
    for (auto d : t.ne) put<int64_t>(b, d);
    put<uint32_t>(b, static_cast<uint32_t>(t.type));
    put<uint64_t>(b, off);
    off = (off + t.data.size() + alignment - 1) / alignment * alignment;
  }
  b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
  for (auto& t : tensors_) {
    b.insert(b.end(), t.data.begin(), t.data.end());
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
  }
  return b;
}

void GgufWriter::write(const std::string& path, uint32_t alignment) const {
  auto bytes = to_bytes(alignment);
  std::ofstream out(path, std::ios::binary);
  FP_CHECK(out, path, ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.flush();  // a full disk shows here, not in a destructor that cannot report it
  FP_CHECK(out, path, ": write failed: ", std::strerror(errno));
}

}  // namespace fp
