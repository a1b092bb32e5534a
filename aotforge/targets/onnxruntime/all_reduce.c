/* The rank graphs' ai.onnx.contrib collectives as native ONNX Runtime custom ops (no Python on the way):
 * AllReduce, and a sequence-parallel prefill's ReduceScatter and AllGather.
 *
 * The same shared-memory all-reduce as targets/generative/shm_all_reduce.py, over the same segment layout:
 * a 4096-byte header of int64 words (word 0: the abort flag, word 1 + r: rank r's arrival counter), then two
 * banks of one float buffer per rank. A call copies its input into its buffer of bank seq % 2, publishes seq
 * (release), waits until every rank has (acquire; spinning, then yielding the core) and sums the buffers in rank
 * order, so every rank gets the same bits. A set abort flag, or a peer not arriving within the timeout, ends
 * the wait at once; ORT's version-13 kernels cannot fail a run, so the rank process reads the flag after each run
 * (native_all_reduce.py) and fails the call there.
 *
 * ReduceScatter(x [batch, T, ...]) -> [batch, c, ...], c = ceil(T / world): the same exchange in whole rows of the
 * sequence axis, each rank summing (in rank order: the all-reduce's bits) only its rows r*c .. r*c + c - 1, zeros
 * past T. AllGather(x [batch, c, ...], tokens [batch, T]) -> [batch, T, ...]: every rank's rows to their places.
 *
 * ONNX Runtime's C API is used through its stable ABI alone: the OrtApiBase / OrtCustomOp layouts and the
 * positions of the few OrtApi functions called, as fixed by API version 13 (the table only ever grows at its
 * end, and GetApi(13) is served by every later runtime). Built by gcc on first use (native_all_reduce.py).
 */
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define API_VERSION 13
#define HEADER_BYTES 4096
#define SPINS 4096
#define TYPE_FLOAT 1 /* ONNXTensorElementDataType */
#define TYPE_INT64 7

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtShapeInfo OrtShapeInfo; /* OrtTensorTypeAndShapeInfo */
typedef void (*AnyFn)(void);

typedef struct {
  const AnyFn* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

/* OrtCustomOp at API version 13; ORT reads the members of later versions only when `version` says so. */
typedef struct CustomOp {
  uint32_t version;
  void* (*CreateKernel)(const struct CustomOp* op, const void* api, const void* info);
  const char* (*GetName)(const struct CustomOp* op);
  const char* (*GetExecutionProviderType)(const struct CustomOp* op);
  int (*GetInputType)(const struct CustomOp* op, size_t index);
  size_t (*GetInputTypeCount)(const struct CustomOp* op);
  int (*GetOutputType)(const struct CustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const struct CustomOp* op);
  void (*KernelCompute)(void* kernel, OrtKernelContext* context);
  void (*KernelDestroy)(void* kernel);
  int (*GetInputCharacteristic)(const struct CustomOp* op, size_t index);
  int (*GetOutputCharacteristic)(const struct CustomOp* op, size_t index);
  int (*GetInputMemoryType)(const struct CustomOp* op, size_t index);
} CustomOp;

/* Positions in OrtApi of the functions called, and their signatures. */
enum {
  CREATE_CUSTOM_OP_DOMAIN = 26,
  CUSTOM_OP_DOMAIN_ADD = 27,
  ADD_CUSTOM_OP_DOMAIN = 28,
  GET_TENSOR_MUTABLE_DATA = 51,
  GET_DIMENSIONS_COUNT = 61,
  GET_DIMENSIONS = 62,
    GET_TENSOR_TYPE_AND_SHAPE = 65,
  KERNEL_CONTEXT_GET_INPUT = 90,
  KERNEL_CONTEXT_GET_OUTPUT = 91,
  RELEASE_STATUS = 93,
  RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99,
};
typedef OrtStatus* (*CreateCustomOpDomainFn)(const char* domain, void** out);
typedef OrtStatus* (*CustomOpDomainAddFn)(void* domain, const CustomOp* op);
typedef OrtStatus* (*AddCustomOpDomainFn)(void* options, void* domain);
typedef OrtStatus* (*GetTensorMutableDataFn)(OrtValue* value, void** out);
typedef OrtStatus* (*GetDimensionsCountFn)(const OrtShapeInfo* info, size_t* out);
typedef OrtStatus* (*GetDimensionsFn)(const OrtShapeInfo* info, int64_t* dims, size_t count);
typedef OrtStatus* (*GetTensorTypeAndShapeFn)(const OrtValue* value, OrtShapeInfo** out);
typedef OrtStatus* (*KernelContextGetInputFn)(const OrtKernelContext* context, size_t index, const OrtValue** out);
typedef OrtStatus* (*KernelContextGetOutputFn)(OrtKernelContext* context, size_t index, const int64_t* dims,
                                               size_t count, OrtValue** out);
typedef void (*ReleaseStatusFn)(OrtStatus* status);
typedef void (*ReleaseShapeInfoFn)(OrtShapeInfo* info);

#define CALL(type, index) ((type)api[index])

static const AnyFn* api;

/* The segment this process's rank reduces over (aotforge_all_reduce_attach). */
static struct {
  volatile int64_t* abort_flag;
  int64_t* counters;
  float* banks;
  int rank, world;
  int64_t capacity, seq;
  double timeout_s;
} comm;

int aotforge_all_reduce_attach(void* base, int rank, int world, int64_t capacity, double timeout_s) {
  comm.abort_flag = (volatile int64_t*)base;
  comm.counters = (int64_t*)base + 1;
  comm.banks = (float*)((char*)base + HEADER_BYTES);
  comm.rank = rank;
  comm.world = world;
  comm.capacity = capacity;
  comm.timeout_s = timeout_s;
  comm.seq = __atomic_load_n(&comm.counters[rank], __ATOMIC_ACQUIRE);
  return 0;
}

/* Forget the segment (before it is unmapped): a run after this leaves its output unwritten, never touches it. */
void aotforge_all_reduce_detach(void) { memset(&comm, 0, sizeof comm); }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int arrived(int64_t seq) {
  for (int r = 0; r < comm.world; ++r)
    if (__atomic_load_n(&comm.counters[r], __ATOMIC_ACQUIRE) < seq) return 0;
  return 1;
}

/* 0 once every rank published seq; -1 if the group aborted (or this rank gave up waiting and aborted it). */
static int wait_for(int64_t seq) {
  double deadline = 0.0;
  for (;;) {
    for (int i = 0; i < SPINS; ++i) {
      if (arrived(seq)) return 0;
      __builtin_ia32_pause();
    }
    if (__atomic_load_n(comm.abort_flag, __ATOMIC_ACQUIRE)) return -1;
    double t = now_s();
    if (deadline == 0.0) deadline = t + comm.timeout_s;
    if (t > deadline) {
      __atomic_store_n(comm.abort_flag, 1, __ATOMIC_RELEASE);
      return -1;
    }
    sched_yield(); /* the peer may be waiting for this core */
  }
}

/* Write len floats of src into this rank's buffer of the next bank and wait for every rank's: the bank, or NULL
 * if the group aborted. */
static const float* publish(const float* src, int64_t len) {
  float* bank = comm.banks + (comm.seq + 1) % 2 * comm.world * comm.capacity;
  memcpy(bank + comm.rank * comm.capacity, src, (size_t)len * sizeof(float));
  comm.seq += 1;
  __atomic_store_n(&comm.counters[comm.rank], comm.seq, __ATOMIC_RELEASE);
  return wait_for(comm.seq) ? NULL : bank;
}

/* Rows of `inner` floats a chunk moves; 0 (and the group aborted) if one row exceeds a buffer. */
static int64_t chunk_rows(int64_t inner) {
  if (inner <= comm.capacity && inner > 0) return comm.capacity / inner;
  __atomic_store_n(comm.abort_flag, 1, __ATOMIC_RELEASE);
  return 0;
}

static void reduce_scatter(const float* x, float* y, int64_t batch, int64_t length, int64_t inner) {
  int64_t size = (length + comm.world - 1) / comm.world, first = comm.rank * size, step = chunk_rows(inner);
  memset(y, 0, (size_t)(batch * size * inner) * sizeof(float));
  if (!step || __atomic_load_n(comm.abort_flag, __ATOMIC_ACQUIRE)) return;
  for (int64_t start = 0; start < batch * length; start += step) {
    int64_t rows = batch * length - start < step ? batch * length - start : step;
    const float* bank = publish(x + start * inner, rows * inner);
    if (!bank) return;
    for (int64_t j = 0; j < rows; ++j) {
      int64_t b = (start + j) / length, t = (start + j) % length;
      if (t < first || t >= first + size) continue;
      float* out = y + (b * size + t - first) * inner;
      memcpy(out, bank + j * inner, (size_t)inner * sizeof(float));
      for (int r = 1; r < comm.world; ++r) {
        const float* part = bank + r * comm.capacity + j * inner;
        for (int64_t i = 0; i < inner; ++i) out[i] += part[i];
      }
    }
  }
}

static void all_gather(const float* x, float* y, int64_t batch, int64_t size, int64_t length, int64_t inner) {
  int64_t step = chunk_rows(inner);
  if (!step || __atomic_load_n(comm.abort_flag, __ATOMIC_ACQUIRE)) return;
  for (int64_t start = 0; start < batch * size; start += step) {
    int64_t rows = batch * size - start < step ? batch * size - start : step;
    const float* bank = publish(x + start * inner, rows * inner);
    if (!bank) return;
    for (int r = 0; r < comm.world; ++r)
      for (int64_t j = 0; j < rows; ++j) {
        int64_t b = (start + j) / size, t = r * size + (start + j) % size;
        if (t < length)
          memcpy(y + (b * length + t) * inner, bank + r * comm.capacity + j * inner, (size_t)inner * sizeof(float));
      }
  }
}

static void all_reduce(const float* x, float* y, int64_t n) {
  if (__atomic_load_n(comm.abort_flag, __ATOMIC_ACQUIRE)) return;
  for (int64_t start = 0; start < n; start += comm.capacity) {
    int64_t len = n - start < comm.capacity ? n - start : comm.capacity;
    const float* bank = publish(x + start, len);
    if (!bank) return;
    float* out = y + start;
    memcpy(out, bank, (size_t)len * sizeof(float));
    for (int r = 1; r < comm.world; ++r) {
      const float* part = bank + r * comm.capacity;
      for (int64_t i = 0; i < len; ++i) out[i] += part[i];
    }
  }
}

/* A failed API call is a broken group: abort it, so the rank process fails the call. */
static int failed(OrtStatus* status) {
  if (!status) return 0;
  CALL(ReleaseStatusFn, RELEASE_STATUS)(status);
  if (comm.abort_flag) __atomic_store_n(comm.abort_flag, 1, __ATOMIC_RELEASE);
  return 1;
}

/* Input `index`'s data and shape; 0 on success. */
static int input_of(OrtKernelContext* context, size_t index, void** data, int64_t* dims, size_t* rank_dims) {
  const OrtValue* input;
  OrtShapeInfo* info;
  if (failed(CALL(KernelContextGetInputFn, KERNEL_CONTEXT_GET_INPUT)(context, index, &input))) return -1;
  if (failed(CALL(GetTensorTypeAndShapeFn, GET_TENSOR_TYPE_AND_SHAPE)(input, &info))) return -1;
  int bad = failed(CALL(GetDimensionsCountFn, GET_DIMENSIONS_COUNT)(info, rank_dims)) || *rank_dims > 16 ||
            failed(CALL(GetDimensionsFn, GET_DIMENSIONS)(info, dims, *rank_dims));
  CALL(ReleaseShapeInfoFn, RELEASE_TENSOR_TYPE_AND_SHAPE_INFO)(info);
  return bad || failed(CALL(GetTensorMutableDataFn, GET_TENSOR_MUTABLE_DATA)((OrtValue*)input, data)) ? -1 : 0;
}

/* Output 0 of shape dims; NULL on failure. */
static float* output_of(OrtKernelContext* context, const int64_t* dims, size_t rank_dims) {
  OrtValue* output;
  void* y;
  if (failed(CALL(KernelContextGetOutputFn, KERNEL_CONTEXT_GET_OUTPUT)(context, 0, dims, rank_dims, &output))) return NULL;
  return failed(CALL(GetTensorMutableDataFn, GET_TENSOR_MUTABLE_DATA)(output, &y)) ? NULL : (float*)y;
}

static int64_t product(const int64_t* dims, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= dims[i];
  return n;
}

static void compute_all_reduce(void* kernel, OrtKernelContext* context) {
  (void)kernel;
  int64_t dims[16];
  size_t rank_dims;
  void* x;
  float* y;
  if (!comm.abort_flag) return; /* not attached: native_all_reduce.py attaches before any session opens */
  if (input_of(context, 0, &x, dims, &rank_dims) || !(y = output_of(context, dims, rank_dims))) return;
  all_reduce((const float*)x, y, product(dims, 0, rank_dims));
}

static void compute_reduce_scatter(void* kernel, OrtKernelContext* context) {
  (void)kernel;
  int64_t dims[16];
  size_t rank_dims;
  void* x;
  float* y;
  if (!comm.abort_flag) return;
  if (input_of(context, 0, &x, dims, &rank_dims)) return;
  if (rank_dims < 2) { __atomic_store_n(comm.abort_flag, 1, __ATOMIC_RELEASE); return; }
  int64_t length = dims[1];
  dims[1] = (length + comm.world - 1) / comm.world;
  if (!(y = output_of(context, dims, rank_dims))) return;
  reduce_scatter((const float*)x, y, dims[0], length, product(dims, 2, rank_dims));
}

static void compute_all_gather(void* kernel, OrtKernelContext* context) {
  (void)kernel;
  int64_t dims[16], token_dims[16];
  size_t rank_dims, token_rank;
  void *x, *tokens;
  float* y;
  if (!comm.abort_flag) return;
  if (input_of(context, 0, &x, dims, &rank_dims) || input_of(context, 1, &tokens, token_dims, &token_rank)) return;
  if (rank_dims < 2 || token_rank < 2) { __atomic_store_n(comm.abort_flag, 1, __ATOMIC_RELEASE); return; }
  int64_t size = dims[1];
  dims[1] = token_dims[1];
  if (!(y = output_of(context, dims, rank_dims))) return;
  all_gather((const float*)x, y, dims[0], size, dims[1], product(dims, 2, rank_dims));
}

static void* create_kernel(const CustomOp* op, const void* api_, const void* info) {
  (void)op, (void)api_, (void)info;
  return &comm;
}
static const char* all_reduce_name(const CustomOp* op) { (void)op; return "AllReduce"; }
static const char* reduce_scatter_name(const CustomOp* op) { (void)op; return "ReduceScatter"; }
static const char* all_gather_name(const CustomOp* op) { (void)op; return "AllGather"; }
static const char* provider(const CustomOp* op) { (void)op; return NULL; /* CPU */ }
static int float_type(const CustomOp* op, size_t index) { (void)op, (void)index; return TYPE_FLOAT; }
static int float_then_int64(const CustomOp* op, size_t index) { (void)op; return index ? TYPE_INT64 : TYPE_FLOAT; }
static size_t one(const CustomOp* op) { (void)op; return 1; }
static size_t two(const CustomOp* op) { (void)op; return 2; }
static void destroy(void* kernel) { (void)kernel; }
static int zero(const CustomOp* op, size_t index) { (void)op, (void)index; return 0; /* required; default memory */ }

/* Zeros after the version-13 members, should a runtime look past them anyway. */
typedef struct {
  CustomOp op;
  void* reserved[32];
} PaddedOp;
static PaddedOp ops[] = {
    {{API_VERSION, create_kernel, all_reduce_name, provider, float_type, one, float_type, one, compute_all_reduce,
      destroy, zero, zero, zero},
     {0}},
    {{API_VERSION, create_kernel, reduce_scatter_name, provider, float_type, one, float_type, one,
      compute_reduce_scatter, destroy, zero, zero, zero},
     {0}},
    {{API_VERSION, create_kernel, all_gather_name, provider, float_then_int64, two, float_type, one,
      compute_all_gather, destroy, zero, zero, zero},
     {0}},
};

/* ONNX Runtime's entry point for SessionOptions.register_custom_ops_library. */
OrtStatus* RegisterCustomOps(void* options, const OrtApiBase* base) {
  void* domain;
  OrtStatus* status;
  api = base->GetApi(API_VERSION);
  if (!api) return NULL; /* a runtime older than version 13: the sessions then refuse AllReduce as unknown */
  if ((status = CALL(CreateCustomOpDomainFn, CREATE_CUSTOM_OP_DOMAIN)("ai.onnx.contrib", &domain))) return status;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; ++i)
    if ((status = CALL(CustomOpDomainAddFn, CUSTOM_OP_DOMAIN_ADD)(domain, &ops[i].op))) return status;
  return CALL(AddCustomOpDomainFn, ADD_CUSTOM_OP_DOMAIN)(options, domain); /* the domain lives as long as the process */
}

/* The OrtApi version this library asks for (read by native_all_reduce.py's checks). */
int aotforge_all_reduce_api_version(void) { return API_VERSION; }
