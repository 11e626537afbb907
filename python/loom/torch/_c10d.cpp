// _c10d.cpp - Loom as a torch.distributed backend: a c10d::Backend over
// libloom, registered as "loom" by loom/torch/distributed.py.
//
// Every operation is a Loom non-blocking call (or, for torch's asyncOp=False,
// the blocking one, which saves two thread hand-offs on the small messages
// that dominate latency-bound jobs). Loom runs a communicator's collectives in
// submission order on its worker, so one completion thread per backend waits
// for them in that order, copies results out of staging buffers (non-contiguous
// tensors, lists of tensors), then finishes the Work and its Future: futures
// complete without anyone calling wait(), as DDP's comm hooks and PowerSGD
// need. Point-to-point operations complete out of collective order, so they
// have a completion thread of their own. Futures are completed by a pool of
// threads (see hand_over).
//
// Rendezvous goes through the store torch hands the backend (TCPStore,
// FileStore, HashStore, PrefixStore) by loom_comm_create_with_store; the
// process group's timeout becomes the communicator's.
//
// CUDA tensors (built with LOOM_C10D_CUDA: setup.py defines it where torch and
// libloom both have CUDA) go to Loom's stream-ordered calls (loom_cuda.h) on a
// stream the backend owns, as ProcessGroupNCCL does: that stream first waits
// for the caller's current stream (the tensors' producer), wait() makes the
// current stream wait for the collective without blocking the host, and the
// completion thread completes the Future once the GPU work is done.
#include <torch/extension.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom.h"

#ifdef LOOM_C10D_CUDA
#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "loom_cuda.h"
#endif

namespace loom_c10d {

using c10d::OpType;
using c10d::ReduceOp;

std::exception_ptr backend_error(const std::string &msg)
{
    try {
        C10_THROW_ERROR(DistBackendError, msg);
    } catch (...) {
        return std::current_exception();
    }
}

[[noreturn]] void throw_backend_error(const std::string &msg)
{
    std::rethrow_exception(backend_error(msg));
}

// ---- The store torch hands us, as Loom's store callbacks. -----------------

struct StoreCtx {
    c10::intrusive_ptr<c10d::Store> store;
};

void put_msg(char *msg, size_t msglen, const std::string &s)
{
    if (msg && msglen) {
        std::snprintf(msg, msglen, "%s", s.c_str());
    }
}

loom_status_t store_set(void *ctx, const char *key, const void *val, size_t len, char *msg,
                        size_t msglen)
{
    auto *s = static_cast<StoreCtx *>(ctx);
    try {
        const uint8_t *p = static_cast<const uint8_t *>(val);
        s->store->set(key, std::vector<uint8_t>(p, p + len));
        return LOOM_SUCCESS;
    } catch (const std::exception &e) {
        put_msg(msg, msglen, std::string("torch store set '") + key + "': " + e.what());
        return LOOM_ERR_TRANSPORT;
    }
}

// Wait for key (no wait with timeout 0). LOOM_ERR_TIMEOUT when it is absent.
loom_status_t store_wait_key(StoreCtx *s, const char *key, double timeout_s, char *msg,
                             size_t msglen)
{
    try {
        if (timeout_s <= 0) {
            return s->store->check({key}) ? LOOM_SUCCESS : LOOM_ERR_TIMEOUT;
        }
        auto ms = std::chrono::milliseconds((int64_t)(timeout_s * 1000.0) + 1);
        s->store->wait({key}, ms);
        return LOOM_SUCCESS;
    } catch (const c10::DistStoreError &e) {
        // torch's stores report a wait that ran out of time this way.
        if (s->store->check({key})) {
            return LOOM_SUCCESS;
        }
        put_msg(msg, msglen, std::string("torch store wait '") + key + "': " + e.what());
        return LOOM_ERR_TIMEOUT;
    } catch (const std::exception &e) {
        put_msg(msg, msglen, std::string("torch store wait '") + key + "': " + e.what());
        return LOOM_ERR_TRANSPORT;
    }
}

loom_status_t store_wait(void *ctx, const char *key, double timeout_s, char *msg, size_t msglen)
{
    return store_wait_key(static_cast<StoreCtx *>(ctx), key, timeout_s, msg, msglen);
}

loom_status_t store_get(void *ctx, const char *key, double timeout_s, void **val_p,
                        size_t *len_p, char *msg, size_t msglen)
{
    auto *s = static_cast<StoreCtx *>(ctx);
    loom_status_t st = store_wait_key(s, key, timeout_s, msg, msglen);
    if (st != LOOM_SUCCESS) {
        return st;
    }
    try {
        std::vector<uint8_t> v = s->store->get(key);
        void *p = std::malloc(v.size() ? v.size() : 1);
        if (!p) {
            return LOOM_ERR_NO_MEMORY;
        }
        if (!v.empty()) {
            std::memcpy(p, v.data(), v.size());
        }
        *val_p = p;
        *len_p = v.size();
        return LOOM_SUCCESS;
    } catch (const std::exception &e) {
        put_msg(msg, msglen, std::string("torch store get '") + key + "': " + e.what());
        return LOOM_ERR_TRANSPORT;
    }
}

loom_status_t store_add(void *ctx, const char *key, int64_t delta, int64_t *value_p, char *msg,
                        size_t msglen)
{
    auto *s = static_cast<StoreCtx *>(ctx);
    try {
        *value_p = s->store->add(key, delta);
        return LOOM_SUCCESS;
    } catch (const std::exception &e) {
        put_msg(msg, msglen, std::string("torch store add '") + key + "': " + e.what());
        return LOOM_ERR_TRANSPORT;
    }
}

loom_status_t store_del(void *ctx, const char *key, int *existed_p, char *msg, size_t msglen)
{
    auto *s = static_cast<StoreCtx *>(ctx);
    try {
        *existed_p = s->store->deleteKey(key) ? 1 : 0;
        return LOOM_SUCCESS;
    } catch (const std::exception &e) {
        put_msg(msg, msglen, std::string("torch store delete '") + key + "': " + e.what());
        return LOOM_ERR_TRANSPORT;
    }
}

void store_release(void *ctx)
{
    delete static_cast<StoreCtx *>(ctx);
}

// ---- Types and operators. ---------------------------------------------------

loom_dtype_t to_loom_dtype(const at::Tensor &t)
{
    switch (t.scalar_type()) {
    case at::kFloat: return LOOM_FLOAT32;
    case at::kDouble: return LOOM_FLOAT64;
    case at::kHalf: return LOOM_FLOAT16;
    case at::kBFloat16: return LOOM_BFLOAT16;
    case at::kChar: return LOOM_INT8;
    case at::kByte: return LOOM_UINT8;
    case at::kBool: return LOOM_UINT8;
    case at::kInt: return LOOM_INT32;
    case at::kLong: return LOOM_INT64;
    case at::kShort: return LOOM_INT16;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    case at::kUInt16: return LOOM_UINT16;
#endif
    default:
        throw_backend_error(std::string("loom: tensors of type ") +
                            std::string(c10::toString(t.scalar_type())) +
                            " are not supported (float32/64, float16, bfloat16, int8, uint8, "
                            "int16, uint16, int32, int64 and bool are)");
    }
}

// The Loom operator for op on t. PREMUL_SUM's factor is applied by the caller.
// bool follows C++ (and Gloo): a sum is a logical or, a product a logical and.
loom_op_t to_loom_op(const ReduceOp &op, const at::Tensor &t)
{
    bool is_bool = t.scalar_type() == at::kBool;
    switch (op.op_) {
    case ReduceOp::SUM: return is_bool ? LOOM_MAX : LOOM_SUM;
    case ReduceOp::PREMUL_SUM: return LOOM_SUM;
    case ReduceOp::AVG:
        if (is_bool) {
            throw_backend_error("loom: ReduceOp.AVG is not defined on bool tensors");
        }
        return LOOM_AVG;
    case ReduceOp::PRODUCT: return is_bool ? LOOM_MIN : LOOM_PROD;
    case ReduceOp::MIN: return LOOM_MIN;
    case ReduceOp::MAX: return LOOM_MAX;
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
        // As Gloo: integer and bool tensors only (bool travels as uint8 0/1).
        if (at::isFloatingType(t.scalar_type())) {
            throw_backend_error(std::string("loom: ReduceOp.") +
                                (op.op_ == ReduceOp::BAND ? "BAND" : op.op_ == ReduceOp::BOR ? "BOR" : "BXOR") +
                                " applies to integer and bool tensors, not " +
                                c10::toString(t.scalar_type()));
        }
        return op.op_ == ReduceOp::BAND ? LOOM_BAND : op.op_ == ReduceOp::BOR ? LOOM_BOR : LOOM_BXOR;
    default:
        throw_backend_error("loom: this ReduceOp is not supported");
    }
}

// Multiply t by PREMUL_SUM's factor before the sum.
void premul(const ReduceOp &op, at::Tensor &t)
{
    if (op.op_ != ReduceOp::PREMUL_SUM) {
        return;
    }
    auto *sup = dynamic_cast<c10d::PreMulSumSupplement *>(op.supplement_.get());
    TORCH_CHECK(sup != nullptr, "loom: PREMUL_SUM without its factor");
    if (sup->tensor_factor.defined()) {
        t.mul_(sup->tensor_factor.to(t.device()));
    } else {
        t.mul_(sup->double_factor);
    }
}

void check_cpu(const at::Tensor &t, const char *what, bool sparse_ok = false)
{
    if (!t.device().is_cpu()) {
#ifdef LOOM_C10D_CUDA
        if (t.device().is_cuda()) {
            throw_backend_error(std::string("loom: ") + what + ": CUDA tensors are not "
                                "supported by this operation (got " + t.device().str() + ")");
        }
#else
        if (t.device().is_cuda()) {
            throw_backend_error(std::string("loom: ") + what + ": a CUDA tensor (" +
                                t.device().str() + "), but this loom.torch._c10d was built "
                                "without CUDA (LOOM_TORCH_CUDA=0, or no CUDA in libloom or "
                                "torch at build time): rebuild it with CUDA, or pass CPU tensors");
        }
#endif
        throw_backend_error(std::string("loom: ") + what +
                            ": only CPU tensors are supported (got " + t.device().str() + ")");
    }
    if (t.is_sparse() && !sparse_ok) {
        throw_backend_error(std::string("loom: ") + what +
                            ": sparse tensors are not supported (all_reduce with SUM takes "
                            "sparse COO tensors)");
    }
}

// The tensors an operation takes: on the CPU, or (in a CUDA build) on CUDA
// devices, sorted out by the operation's device (call_device).
void check_device(const at::Tensor &t, const char *what)
{
#ifdef LOOM_C10D_CUDA
    if (t.device().is_cuda() && !t.is_sparse()) {
        return;
    }
#endif
    check_cpu(t, what);
}

// ---- Work. -----------------------------------------------------------------

// A call into Loom: given a request pointer it starts a non-blocking
// operation, given nullptr it runs the blocking one.
using LoomCall = std::function<loom_status_t(loom_request_t *)>;

// The same call on CUDA buffers, stream-ordered on the given stream;
// ON_STREAM(loom_x_stream, args...) makes one (the stream goes last). Builds
// without CUDA carry an empty placeholder, so the operations read the same.
#ifdef LOOM_C10D_CUDA
using StreamCall = std::function<loom_status_t(cudaStream_t)>;
#define ON_STREAM(fn, ...) \
    StreamCall([=, this](cudaStream_t on_stream_) { return fn(__VA_ARGS__, on_stream_); })
#else
struct StreamCall {};
#define ON_STREAM(fn, ...) StreamCall()
#endif

struct Call {
    LoomCall host;
    StreamCall stream;
};

class LoomWork : public c10d::Work {
  public:
    // title ("loom:all_reduce", as Gloo's "gloo:all_reduce") names the event
    // torch's profiler records from here to finish(), with the inputs' shapes.
    // devices: the CUDA device of a GPU operation (its future then records
    // events on it, as ProcessGroupNCCL's), else none.
    LoomWork(int rank, OpType type, const std::string &title,
             const std::vector<at::Tensor> &inputs, std::vector<at::Tensor> outputs,
             std::string what, std::vector<c10::Device> devices = {})
        : c10d::Work(rank, type, title.c_str(), inputs), outputs_(std::move(outputs)),
          what_(std::move(what)),
          future_(c10::make_intrusive<at::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get()), std::move(devices)))
    {
    }

#ifdef LOOM_C10D_CUDA
    // A GPU operation's wait() orders the caller's current stream after the
    // collective and returns at once, as ProcessGroupNCCL's: the host does
    // not block. Failures known by then are raised.
    bool wait(std::chrono::milliseconds timeout) override
    {
        if (!end_) {
            return c10d::Work::wait(timeout);
        }
        if (future_->completed() && future_->hasError()) {
            std::rethrow_exception(future_->exception_ptr());
        }
        synchronize();
        return true;
    }

    void synchronize() override
    {
        if (end_) {
            c10::cuda::CUDAGuard g(*device_);
            end_->block(c10::cuda::getCurrentCUDAStream(device_->index()));
        }
    }
#endif

    std::vector<at::Tensor> result() override { return outputs_; }
    int sourceRank() const override { return src_rank_; }
    // complete() marks the future just before finish(): done once either is.
    bool isCompleted() override { return future_->completed() || c10d::Work::isCompleted(); }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

    // Called once, by the thread that saw the Loom calls end.
    void complete(std::exception_ptr eptr)
    {
        if (!eptr && post_) {
            try {
                post_();
            } catch (...) {
                eptr = std::current_exception();
            }
        }
        // Staging buffers and inputs are no longer needed.
        post_ = nullptr;
        keep_.clear();
        // The future first: whoever wait() releases may read it at once.
        if (eptr) {
            future_->setError(eptr);
        } else {
#ifdef LOOM_C10D_CUDA
            // The future's events go on the stream the collective ran on.
            std::optional<c10::cuda::CUDAStreamGuard> sg;
            if (stream_) {
                sg.emplace(*stream_);
            }
#endif
            future_->markCompleted(c10::IValue(outputs_));
        }
        finish(eptr);
    }

    std::vector<at::Tensor> outputs_;
    std::vector<at::Tensor> keep_;       // buffers Loom reads or writes until done
    std::function<void()> post_;         // copies results out, after success
    std::vector<loom_request_t> reqs_;
    std::string what_;
    std::string start_error_;            // a later call of a multi-call Work that failed to start
    std::shared_ptr<void> keep_alive_;   // count arrays an alltoallv reads
    int src_rank_ = -1;
    std::exception_ptr eptr_;            // how the Loom calls ended, for complete()
    std::optional<c10::Device> device_;  // the CUDA device of a GPU operation
#ifdef LOOM_C10D_CUDA
    std::optional<c10::cuda::CUDAStream> stream_;   // the backend's stream it ran on
    std::shared_ptr<c10::Event> end_;    // recorded on stream_ after the collective
#endif

  private:
    c10::intrusive_ptr<at::ivalue::Future> future_;
};

// ---- The backend. -------------------------------------------------------------

class LoomBackend : public c10d::Backend {
  public:
    // device: the CUDA device init_process_group's device_id names (-1: none;
    // otherwise the first CUDA tensors' device).
    LoomBackend(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                std::chrono::milliseconds timeout, std::string profile_name = "loom",
                int device = -1)
        : c10d::Backend(rank, size), store_(store), timeout_(timeout),
          profile_name_(std::move(profile_name))
    {
        loom_config_t cfg = LOOM_CONFIG_INIT;
        cfg.rank = rank;
        cfg.size = size;
        cfg.timeout_s = timeout.count() > 0 ? (double)timeout.count() / 1000.0 : 0.0;
        loom_store_callbacks_t cb;
        std::memset(&cb, 0, sizeof(cb));
        cb.struct_size = sizeof(cb);
        cb.ctx = new StoreCtx{store};
        cb.set = store_set;
        cb.get = store_get;
        cb.add = store_add;
        cb.del = store_del;
        cb.wait = store_wait;
        cb.release = store_release;
        loom_status_t st = loom_comm_create_with_store(&cfg, &cb, &comm_);
        if (st != LOOM_SUCCESS) {
            throw_backend_error(std::string("loom: rank ") + std::to_string(rank) + " of " +
                                std::to_string(size) + ": creating the communicator failed: " +
                                loom_comm_last_error(nullptr));
        }
        bind_or_destroy(device);
        start_threads();
    }

    // A group split from another (split()): it owns comm.
    LoomBackend(loom_comm_t comm, const c10::intrusive_ptr<c10d::Store> &store,
                std::chrono::milliseconds timeout, std::string profile_name, int device = -1)
        : c10d::Backend(loom_comm_rank(comm), loom_comm_size(comm)), comm_(comm), store_(store),
          timeout_(timeout), profile_name_(std::move(profile_name))
    {
        bind_or_destroy(device);
        start_threads();
    }

    ~LoomBackend() override { release(); }

    const std::string getBackendName() const override { return "loom"; }

    void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

    // As Gloo's: one number per operation this rank started on the group
    // (collectives, barriers, sends and receives), from 0 on every rank. The
    // ProcessGroupWrapper that TORCH_DISTRIBUTED_DEBUG=DETAIL puts around the
    // group compares it across ranks before each collective.
    uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
    void setSequenceNumberForGroup() override {}   // always starts at 0

    // Gloo's monitored barrier, over the group's store rather than messages
    // (a receive Loom posted cannot be withdrawn when its wait times out):
    // every other rank announces itself and waits for rank 0's verdict; rank 0
    // waits for each in rank order within the timeout (each rank the whole
    // timeout with wait_all_ranks) and names the first that did not come, or
    // all of them, in Gloo's words; then releases the others, or fails them.
    void monitoredBarrier(const c10d::BarrierOptions &opts, bool waitAllRanks) override
    {
        using namespace std::chrono;
        auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
        uint64_t n = monitored_++;
        std::string base = "loom/monitored_barrier/" + std::to_string(n) + "/";
        int rank = getRank(), size = getSize();
        if (!store_) {
            throw_backend_error("loom: monitored_barrier: this group has no store");
        }
        if (rank != 0) {
            store_->set(base + "arrived/" + std::to_string(rank), std::vector<uint8_t>{1});
            std::string verdict;
            try {
                store_->wait({base + "verdict"}, timeout_);
                auto v = store_->get(base + "verdict");
                verdict.assign(v.begin(), v.end());
            } catch (const c10::Error &e) {
                verdict = e.what_without_backtrace();
            } catch (const std::exception &e) {
                verdict = e.what();
            }
            if (verdict != "ok") {
                TORCH_CHECK(false, "Rank ", rank, " successfully reached monitoredBarrier, but "
                            "received errors while waiting for send/recv from rank 0. Please "
                            "check rank 0 logs for faulty rank.\n Original exception: \n",
                            verdict.empty() ? "rank 0 failed the barrier" : verdict);
            }
            return;
        }
        auto start = steady_clock::now();
        std::vector<int> processed, failed;
        std::string error;
        for (int r = 1; r < size && error.empty(); r++) {
            milliseconds left = timeout;
            if (!waitAllRanks) {
                left = timeout - duration_cast<milliseconds>(steady_clock::now() - start);
                if (left.count() <= 0) {
                    error = c10::str("Rank ", rank, " timed out in monitoredBarrier after ",
                                     timeout.count(), " ms.\n",
                                     processed.empty()
                                         ? std::string("No ranks successfully processed in "
                                                       "monitoredBarrier.")
                                         : "Successfully processed ranks: " +
                                               c10::Join(", ", processed));
                    break;
                }
            }
            std::string why;
            try {
                store_->wait({base + "arrived/" + std::to_string(r)}, left);
                processed.push_back(r);
                continue;
            } catch (const c10::Error &e) {
                why = e.what_without_backtrace();
            } catch (const std::exception &e) {
                why = e.what();
            }
            if (store_->check({base + "arrived/" + std::to_string(r)})) {
                processed.push_back(r);
                continue;
            }
            std::string msg = c10::str("[Rank 0]: Rank ", r, " failed to pass monitoredBarrier in ",
                                       timeout.count(), " ms");
            if (waitAllRanks) {
                failed.push_back(r);
            } else {
                error = msg + "\n Original exception: \n" + why;
            }
        }
        if (error.empty() && !failed.empty()) {
            error = c10::str("[Rank 0]: Ranks ", c10::Join(", ", failed),
                             " failed to pass monitoredBarrier in ", timeout.count(), " ms");
        }
        std::string verdict = error.empty() ? "ok" : error;
        store_->set(base + "verdict", std::vector<uint8_t>(verdict.begin(), verdict.end()));
        if (!error.empty()) {
            LOG(ERROR) << error;
            TORCH_CHECK(false, error);
        }
    }

    void abort() override
    {
        std::lock_guard<std::mutex> g(life_mu_);
        if (comm_) {
            loom_comm_abort(comm_);
        }
    }

    void shutdown() override { release(); }

    // dist.split_group: every rank of this group calls it (torch passes a rank
    // of no split some other split's ranks); loom_comm_split over this group's
    // communicator, colour the split's lowest rank (the splits are disjoint),
    // key the position in it (torch keeps that order); the others get none.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
    // (Backend::split with this signature: checked against torch 2.15.)
    bool supportsSplitting() const override { return true; }

    // splitGroup clones these for the child (then split() gets the clone).
    c10::intrusive_ptr<Options> getBackendOptions() override
    {
        return c10::make_intrusive<Options>("loom", timeout_);
    }

    c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store> &store,
                                            const std::vector<int> &ranks,
                                            const c10::intrusive_ptr<Options> &opts) override
    {
        (void)store;   // no rendezvous: the parent's connections carry the split
        // ProcessGroup::splitGroup asks the backend of each device the group
        // has (this one serves cpu and cuda), and a rank in no split asks
        // again where a member reuses its first answer: the asks of one split
        // (one group name) get one loom_comm_split, every rank making one.
        std::string name = opts ? opts->group_name : std::string();
        if (!name.empty() && name == last_split_name_) {
            return last_split_.lock();
        }
        auto me = std::find(ranks.begin(), ranks.end(), getRank());
        int color = LOOM_UNDEFINED, key = 0;
        if (me != ranks.end()) {
            color = *std::min_element(ranks.begin(), ranks.end());
            key = (int)(me - ranks.begin());
        }
        loom_comm_t sub = nullptr;
        loom_status_t st;
        drain_stream();   // a call without a stream: the stream's calls first
        {
            std::lock_guard<std::mutex> g(submit_mu_);
            st = loom_comm_split(comm_, color, key, &sub);
        }
        if (st != LOOM_SUCCESS) {
            throw_backend_error(std::string("loom: split_group: ") + loom_comm_last_error(comm_));
        }
        last_split_name_ = name;
        last_split_.reset();
        if (!sub) {
            return nullptr;
        }
        auto timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_;
        c10::intrusive_ptr<c10d::Backend> child =
            c10::make_intrusive<LoomBackend>(sub, store, timeout, profile_name_, cuda_device_);
        last_split_ = c10::weak_intrusive_ptr<c10d::Backend>(child);
        return child;
    }

    std::string last_split_name_;   // the last split() and its result, for its repeats
    c10::weak_intrusive_ptr<c10d::Backend> last_split_{c10::intrusive_ptr<c10d::Backend>()};
#endif

    // ---- Collectives. ----

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override
    {
        at::Tensor t = single(tensors, "broadcast");
        auto w = make_work(OpType::BROADCAST, {t}, "broadcast");
        at::Tensor buf = staged(w, t, getRank() == opts.rootRank);
        int root = (int)opts.rootRank;
        loom_dtype_t dt = to_loom_dtype(buf);
        size_t n = (size_t)buf.numel();
        void *p = buf.data_ptr();
        return run(w, {{[=, this](loom_request_t *r) {
                            return r ? loom_ibroadcast(p, n, dt, root, comm_, r)
                                     : loom_broadcast(p, n, dt, root, comm_);
                        },
                        ON_STREAM(loom_broadcast_stream, p, n, dt, root, comm_)}},
                   opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override
    {
        if (tensors.size() == 1 && tensors[0].is_sparse()) {
            return sparse_allreduce(tensors, opts);
        }
        at::Tensor t = single(tensors, "allreduce");
        auto w = make_work(OpType::ALLREDUCE, {t}, "allreduce");
        loom_op_t op = to_loom_op(opts.reduceOp, t);
        at::Tensor buf = staged(w, t, true);
        premul(opts.reduceOp, buf);
        loom_dtype_t dt = to_loom_dtype(buf);
        size_t n = (size_t)buf.numel();
        void *p = buf.data_ptr();
        return run(w, {{[=, this](loom_request_t *r) {
                            return r ? loom_iallreduce(LOOM_IN_PLACE, p, n, dt, op, comm_, r)
                                     : loom_allreduce(LOOM_IN_PLACE, p, n, dt, op, comm_);
                        },
                        ON_STREAM(loom_allreduce_stream, LOOM_IN_PLACE, p, n, dt, op, comm_)}},
                   opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor> &tensors,
                                                    const c10d::AllreduceOptions &opts) override
    {
        return sparse_allreduce(tensors, opts);
    }

    // A sparse COO tensor summed as Gloo sums it: each rank's coalesced
    // indices and values gathered from all, added up in rank order and
    // coalesced; the tensor takes the result. Runs in the calling thread (the
    // Work is complete on return), its calls ordered with the group's others.
    c10::intrusive_ptr<c10d::Work> sparse_allreduce(std::vector<at::Tensor> &tensors,
                                                    const c10d::AllreduceOptions &opts)
    {
        TORCH_CHECK(tensors.size() == 1, "loom: allreduce takes one tensor per process (got ",
                    tensors.size(), ")");
        at::Tensor t = tensors[0];
        check_cpu(t, "allreduce", /*sparse_ok=*/true);
        if (opts.reduceOp.op_ != ReduceOp::SUM) {
            throw_backend_error("loom: allreduce of a sparse tensor: only ReduceOp.SUM is "
                                "supported");
        }
        auto w = make_work(OpType::ALLREDUCE, {t}, "allreduce (sparse)");
        drain_stream();   // blocking calls without a stream: the stream's calls first
        int size = getSize();
        at::Tensor in = t.coalesce();
        at::Tensor idx = in._indices().contiguous();   // sparse_dim x nnz, int64
        at::Tensor val = in._values().contiguous();    // nnz x dense sizes
        int64_t per_value = 1;   // elements of one value (the dense part)
        for (int64_t d = 1; d < val.dim(); d++) {
            per_value *= val.size(d);
        }
        // Loom wants a buffer even for no elements.
        static int64_t none[1];
        auto ptr = [](const at::Tensor &x) { return x.numel() ? x.data_ptr() : (void *)none; };
        // Metadata: nnz, sparse and dense dimension counts, size, from every rank.
        std::vector<int64_t> meta{in._nnz(), in.sparse_dim(), in.dense_dim(), in.dim()};
        for (int64_t d : in.sizes()) {
            meta.push_back(d);
        }
        at::Tensor mine = at::tensor(meta, at::kLong);
        at::Tensor all = at::empty({(int64_t)size * mine.numel()}, at::kLong);
        auto call = [&](const char *what, const std::function<loom_status_t()> &f) {
            loom_status_t st = f();
            if (st != LOOM_SUCCESS) {
                w->complete(backend_error(failure(what, st, loom_comm_last_error(comm_))));
                std::rethrow_exception(w->exception());
            }
        };
        call("allreduce (sparse): the shapes", [&] {
            return loom_allgather(mine.data_ptr(), all.data_ptr(), (size_t)mine.numel(),
                                  LOOM_INT64, comm_);
        });
        auto am = all.view({size, mine.numel()});
        std::vector<size_t> icounts(size), idispl(size), vcounts(size), vdispl(size);
        size_t ioff = 0, voff = 0;
        for (int r = 0; r < size; r++) {
            auto row = am[r];
            if (!at::equal(row.narrow(0, 1, row.numel() - 1), mine.narrow(0, 1, mine.numel() - 1))) {
                w->complete(backend_error(
                    "loom: allreduce (sparse): rank " + std::to_string(r) +
                    "'s sparse tensor has another shape or other sparse/dense dimensions "
                    "than this rank's"));
                std::rethrow_exception(w->exception());
            }
            int64_t nnz = row[0].item<int64_t>();
            icounts[r] = (size_t)(nnz * in.sparse_dim());
            idispl[r] = ioff;
            ioff += icounts[r];
            vcounts[r] = (size_t)(nnz * per_value);
            vdispl[r] = voff;
            voff += vcounts[r];
        }
        at::Tensor all_idx = at::empty({(int64_t)ioff}, at::kLong);
        at::Tensor all_val = at::empty({(int64_t)voff}, val.options());
        loom_dtype_t vdt = to_loom_dtype(val);
        call("allreduce (sparse): the indices", [&] {
            return loom_allgatherv(ptr(idx), (size_t)idx.numel(), ptr(all_idx),
                                   icounts.data(), idispl.data(), LOOM_INT64, comm_);
        });
        call("allreduce (sparse): the values", [&] {
            return loom_allgatherv(ptr(val), (size_t)val.numel(), ptr(all_val),
                                   vcounts.data(), vdispl.data(), vdt, comm_);
        });
        std::vector<int64_t> vshape(val.sizes().begin(), val.sizes().end());
        at::Tensor out;
        for (int r = 0; r < size; r++) {
            int64_t nnz = am[r][0].item<int64_t>();
            vshape[0] = nnz;
            at::Tensor ri = all_idx.narrow(0, (int64_t)idispl[r], (int64_t)icounts[r])
                                .view({in.sparse_dim(), nnz});
            at::Tensor rv = all_val.narrow(0, (int64_t)vdispl[r], (int64_t)vcounts[r])
                                .view(vshape);
            at::Tensor part = at::sparse_coo_tensor(ri, rv, in.sizes(), in.options());
            out = r == 0 ? part : out + part;
        }
        out = out.coalesce();
        t.copy_(out);
        w->complete(nullptr);
        return w;
    }

    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) override
    {
        TORCH_CHECK(!tensors.empty(), "loom: allreduce_coalesced of no tensors");
        for (auto &t : tensors) {
            check_device(t, "allreduce_coalesced");
            TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                        "loom: allreduce_coalesced: tensors must have one type");
        }
        auto w = make_work(OpType::ALLREDUCE_COALESCED, tensors, "allreduce_coalesced");
        loom_op_t op = to_loom_op(opts.reduceOp, tensors[0]);
        // One allreduce over the tensors laid end to end.
        std::vector<at::Tensor> flat_in;
        for (auto &t : tensors) {
            flat_in.push_back(t.reshape({-1}));
        }
        at::Tensor flat = at::cat(flat_in);
        premul(opts.reduceOp, flat);
        w->keep_.push_back(flat);
        std::vector<at::Tensor> outs = tensors;
        w->post_ = [flat, outs]() mutable {
            int64_t off = 0;
            for (auto &o : outs) {
                o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
                off += o.numel();
            }
        };
        loom_dtype_t dt = to_loom_dtype(flat);
        size_t n = (size_t)flat.numel();
        void *p = flat.data_ptr();
        return run(w, {{[=, this](loom_request_t *r) {
                            return r ? loom_iallreduce(LOOM_IN_PLACE, p, n, dt, op, comm_, r)
                                     : loom_allreduce(LOOM_IN_PLACE, p, n, dt, op, comm_);
                        },
                        ON_STREAM(loom_allreduce_stream, LOOM_IN_PLACE, p, n, dt, op, comm_)}},
                   opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts) override
    {
        at::Tensor t = single(tensors, "reduce");
        auto w = make_work(OpType::REDUCE, {t}, "reduce");
        loom_op_t op = to_loom_op(opts.reduceOp, t);
        bool at_root = getRank() == opts.rootRank;
        // The root's tensor gets the result; the others' are left as they were.
        at::Tensor buf = at_root ? staged(w, t, true) : t.contiguous().clone();
        if (!at_root) {
            w->keep_.push_back(buf);
        }
        premul(opts.reduceOp, buf);
        loom_dtype_t dt = to_loom_dtype(buf);
        size_t n = (size_t)buf.numel();
        void *p = buf.data_ptr();
        int root = (int)opts.rootRank;
        return run(w, {{[=, this](loom_request_t *r) {
                            return r ? loom_ireduce(LOOM_IN_PLACE, p, n, dt, op, root, comm_, r)
                                     : loom_reduce(LOOM_IN_PLACE, p, n, dt, op, root, comm_);
                        },
                        ON_STREAM(loom_reduce_stream, LOOM_IN_PLACE, p, n, dt, op, root, comm_)}},
                   opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &opts) override
    {
        at::Tensor in = single(inputs, "allgather");
        TORCH_CHECK(outputs.size() == 1, "loom: allgather takes one list of outputs");
        auto &outs = outputs[0];
        check_list(outs, in, "allgather");
        auto w = make_work(OpType::ALLGATHER, outs, "allgather", &inputs);
        at::Tensor src = in.contiguous();
        at::Tensor flat = at::empty({(int64_t)getSize() * in.numel()}, in.options());
        w->keep_.insert(w->keep_.end(), {src, flat});
        w->post_ = [flat, outs]() mutable { unflatten(flat, outs); };
        return run(w, {gather_call(src, flat, /*root=*/-1)}, opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &opts) override
    {
        check_device(input, "allgather_into_tensor");
        check_device(output, "allgather_into_tensor");
        TORCH_CHECK(output.numel() == input.numel() * getSize(),
                    "loom: allgather_into_tensor: the output must hold world size times the "
                    "input's elements");
        TORCH_CHECK(output.scalar_type() == input.scalar_type(),
                    "loom: allgather_into_tensor: input and output types differ");
        std::vector<at::Tensor> ins{input};
        auto w = make_work(OpType::_ALLGATHER_BASE, {output}, "allgather_into_tensor", &ins);
        at::Tensor src = input.contiguous();
        at::Tensor dst = staged(w, output, false);
        w->keep_.push_back(src);
        return run(w, {gather_call(src, dst, -1)}, opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::AllgatherOptions &opts) override
    {
        TORCH_CHECK(outputs.size() == inputs.size(),
                    "loom: allgather_into_tensor_coalesced: as many outputs as inputs");
        auto w = make_work(OpType::ALLGATHER_INTO_TENSOR_COALESCED, outputs,
                           "allgather_into_tensor_coalesced", nullptr, &inputs);
        std::vector<Call> calls;
        std::vector<std::function<void()>> posts;
        for (size_t i = 0; i < inputs.size(); i++) {
            check_device(inputs[i], "allgather_into_tensor_coalesced");
            TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize() &&
                            outputs[i].scalar_type() == inputs[i].scalar_type(),
                        "loom: allgather_into_tensor_coalesced: output ", i,
                        " must hold world size times input ", i);
            at::Tensor src = inputs[i].contiguous();
            at::Tensor dst = outputs[i].is_contiguous() ? outputs[i]
                                                          : at::empty_like(outputs[i],
                                                                at::MemoryFormat::Contiguous);
            w->keep_.push_back(src);
            w->keep_.push_back(dst);
            if (!dst.is_same(outputs[i])) {
                at::Tensor o = outputs[i];
                posts.push_back([o, dst]() mutable { o.copy_(dst); });
            }
            calls.push_back(gather_call(src, dst, -1));
        }
        w->post_ = [posts]() {
            for (auto &p : posts) {
                p();
            }
        };
        return run(w, std::move(calls), opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> allgather_coalesced(
        std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::AllgatherOptions &opts) override
    {
        TORCH_CHECK(outputs.size() == (size_t)getSize(),
                    "loom: allgather_coalesced: one output list per rank");
        // Each rank's inputs laid end to end; one allgather of those.
        std::vector<at::Tensor> flat_in;
        for (auto &t : inputs) {
            check_device(t, "allgather_coalesced");
            TORCH_CHECK(t.scalar_type() == inputs[0].scalar_type(),
                        "loom: allgather_coalesced: tensors must have one type");
            flat_in.push_back(t.reshape({-1}));
        }
        TORCH_CHECK(!inputs.empty(), "loom: allgather_coalesced of no tensors");
        at::Tensor src = at::cat(flat_in);
        at::Tensor flat = at::empty({(int64_t)getSize() * src.numel()}, src.options());
        std::vector<at::Tensor> all_outs;
        for (auto &l : outputs) {
            TORCH_CHECK(l.size() == inputs.size(),
                        "loom: allgather_coalesced: each output list matches the inputs");
            for (auto &o : l) {
                all_outs.push_back(o);
            }
        }
        auto w = make_work(OpType::ALLGATHER_COALESCED, all_outs, "allgather_coalesced", &inputs);
        w->keep_.insert(w->keep_.end(), {src, flat});
        w->post_ = [flat, all_outs]() mutable { unflatten(flat, all_outs); };
        return run(w, {gather_call(src, flat, -1)}, opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::GatherOptions &opts) override
    {
        at::Tensor in = single(inputs, "gather");
        int root = (int)opts.rootRank;
        bool at_root = getRank() == root;
        std::vector<at::Tensor> outs;
        if (at_root) {
            TORCH_CHECK(outputs.size() == 1, "loom: gather takes one list of outputs at the root");
            outs = outputs[0];
            check_list(outs, in, "gather");
        } else {
            TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                        "loom: gather: outputs are given at the root only");
        }
        auto w = make_work(OpType::GATHER, outs, "gather", &inputs);
        at::Tensor src = in.contiguous();
        at::Tensor flat = at_root ? at::empty({(int64_t)getSize() * in.numel()}, in.options())
                                  : at::empty({0}, in.options());
        w->keep_.insert(w->keep_.end(), {src, flat});
        if (at_root) {
            w->post_ = [flat, outs]() mutable { unflatten(flat, outs); };
        }
        return run(w, {gather_call(src, flat, root)}, opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts) override
    {
        at::Tensor out = single(outputs, "scatter");
        int root = (int)opts.rootRank;
        bool at_root = getRank() == root;
        at::Tensor flat;
        if (at_root) {
            TORCH_CHECK(inputs.size() == 1, "loom: scatter takes one list of inputs at the root");
            check_list(inputs[0], out, "scatter");
            flat = flatten(inputs[0]);
        } else {
            TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                        "loom: scatter: inputs are given at the root only");
            flat = at::empty({0}, out.options());
        }
        auto w = make_work(OpType::SCATTER, {out}, "scatter", nullptr,
                           at_root ? &inputs[0] : nullptr);
        at::Tensor dst = staged(w, out, false);
        w->keep_.push_back(flat);
        loom_dtype_t dt = to_loom_dtype(dst);
        size_t n = (size_t)dst.numel();
        const void *s = flat.data_ptr();
        void *d = dst.data_ptr();
        return run(w, {{[=, this](loom_request_t *r) {
                            return r ? loom_iscatter(s, d, n, dt, root, comm_, r)
                                     : loom_scatter(s, d, n, dt, root, comm_);
                        },
                        ON_STREAM(loom_scatter_stream, s, d, n, dt, root, comm_)}},
                   opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override
    {
        at::Tensor out = single(outputs, "reduce_scatter");
        TORCH_CHECK(inputs.size() == 1, "loom: reduce_scatter takes one list of inputs");
        auto &ins = inputs[0];
        TORCH_CHECK(ins.size() == (size_t)getSize(),
                    "loom: reduce_scatter: one input per rank");
        bool even = true;
        for (auto &t : ins) {
            check_device(t, "reduce_scatter");
            TORCH_CHECK(t.scalar_type() == out.scalar_type(),
                        "loom: reduce_scatter: input and output types differ");
            even = even && t.numel() == ins[0].numel();
        }
        TORCH_CHECK(ins[getRank()].numel() == out.numel(),
                    "loom: reduce_scatter: the output must match this rank's input");
        auto w = make_work(OpType::REDUCE_SCATTER, {out}, "reduce_scatter", nullptr, &ins);
        loom_op_t op = to_loom_op(opts.reduceOp, out);
        at::Tensor flat = flatten(ins);
        premul(opts.reduceOp, flat);
        w->keep_.push_back(flat);
        loom_dtype_t dt = to_loom_dtype(flat);
        void *p = flat.data_ptr();
        if (even) {
            at::Tensor dst = staged(w, out, false);
            size_t n = (size_t)dst.numel();
            void *d = dst.data_ptr();
            return run(w, {{[=, this](loom_request_t *r) {
                                return r ? loom_ireduce_scatter(p, d, n, dt, op, comm_, r)
                                         : loom_reduce_scatter(p, d, n, dt, op, comm_);
                            },
                            ON_STREAM(loom_reduce_scatter_stream, p, d, n, dt, op, comm_)}},
                       opts.asyncOp);
        }
        // Blocks of different sizes: reduce them all, keep this rank's.
        int64_t off = 0;
        for (int r = 0; r < getRank(); r++) {
            off += ins[r].numel();
        }
        size_t n = (size_t)flat.numel();
        w->post_ = [flat, out, off]() mutable {
            out.copy_(flat.narrow(0, off, out.numel()).view(out.sizes()));
        };
        return run(w, {{[=, this](loom_request_t *r) {
                            return r ? loom_iallreduce(LOOM_IN_PLACE, p, n, dt, op, comm_, r)
                                     : loom_allreduce(LOOM_IN_PLACE, p, n, dt, op, comm_);
                        },
                        ON_STREAM(loom_allreduce_stream, LOOM_IN_PLACE, p, n, dt, op, comm_)}},
                   opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) override
    {
        std::vector<at::Tensor> outs{output}, ins{input};
        return reduce_scatter_tensor_coalesced(outs, ins, opts);
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::ReduceScatterOptions &opts) override
    {
        TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(),
                    "loom: reduce_scatter_tensor: as many outputs as inputs");
        auto w = make_work(outputs.size() == 1 ? OpType::_REDUCE_SCATTER_BASE
                                               : OpType::REDUCE_SCATTER_TENSOR_COALESCED,
                           outputs, "reduce_scatter_tensor", nullptr, &inputs);
        std::vector<Call> calls;
        std::vector<std::function<void()>> posts;
        for (size_t i = 0; i < inputs.size(); i++) {
            check_device(inputs[i], "reduce_scatter_tensor");
            check_device(outputs[i], "reduce_scatter_tensor");
            TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize() &&
                            inputs[i].scalar_type() == outputs[i].scalar_type(),
                        "loom: reduce_scatter_tensor: input ", i,
                        " must hold world size times output ", i, " of the same type");
            loom_op_t op = to_loom_op(opts.reduceOp, outputs[i]);
            at::Tensor src = inputs[i].contiguous();
            if (opts.reduceOp.op_ == ReduceOp::PREMUL_SUM) {
                src = src.clone();
                premul(opts.reduceOp, src);
            }
            at::Tensor dst = outputs[i].is_contiguous() ? outputs[i]
                                                        : at::empty_like(outputs[i],
                                                              at::MemoryFormat::Contiguous);
            w->keep_.push_back(src);
            w->keep_.push_back(dst);
            if (!dst.is_same(outputs[i])) {
                at::Tensor o = outputs[i];
                posts.push_back([o, dst]() mutable { o.copy_(dst); });
            }
            loom_dtype_t dt = to_loom_dtype(dst);
            size_t n = (size_t)dst.numel();
            const void *s = src.data_ptr();
            void *d = dst.data_ptr();
            calls.push_back({[=, this](loom_request_t *r) {
                                 return r ? loom_ireduce_scatter(s, d, n, dt, op, comm_, r)
                                          : loom_reduce_scatter(s, d, n, dt, op, comm_);
                             },
                             ON_STREAM(loom_reduce_scatter_stream, s, d, n, dt, op, comm_)});
        }
        w->post_ = [posts]() {
            for (auto &p : posts) {
                p();
            }
        };
        return run(w, std::move(calls), opts.asyncOp);
    }

    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &outSplits,
                                                 std::vector<int64_t> &inSplits,
                                                 const c10d::AllToAllOptions &opts) override
    {
        check_device(input, "all_to_all_single");
        check_device(output, "all_to_all_single");
        TORCH_CHECK(input.scalar_type() == output.scalar_type(),
                    "loom: all_to_all_single: input and output types differ");
        int size = getSize();
        std::vector<at::Tensor> ins{input};
        auto w = make_work(OpType::ALLTOALL_BASE, {output}, "all_to_all_single", &ins);
        at::Tensor src = input.contiguous();
        at::Tensor dst = staged(w, output, false);
        w->keep_.push_back(src);
        loom_dtype_t dt = to_loom_dtype(dst);
        const void *s = src.data_ptr();
        void *d = dst.data_ptr();
        if (outSplits.empty() && inSplits.empty()) {
            TORCH_CHECK(input.numel() == output.numel() && input.numel() % size == 0,
                        "loom: all_to_all_single: input and output must have the same size, "
                        "a multiple of the world size");
            size_t n = (size_t)(input.numel() / size);
            return run(w, {{[=, this](loom_request_t *r) {
                                return r ? loom_ialltoall(s, d, n, dt, comm_, r)
                                         : loom_alltoall(s, d, n, dt, comm_);
                            },
                            ON_STREAM(loom_alltoall_stream, s, d, n, dt, comm_)}},
                       opts.asyncOp);
        }
        auto counts = std::make_shared<std::vector<size_t>>(4 * (size_t)size);
        size_t *sc = counts->data(), *sd = sc + size, *rc = sd + size, *rd = rc + size;
        split_counts(input, inSplits, sc, sd, "input");
        split_counts(output, outSplits, rc, rd, "output");
        // (The stream form copies the arrays.)
        return run(w, {{[=, this](loom_request_t *r) {
                            (void)counts;   // keeps the arrays alive as long as the call
                            return r ? loom_ialltoallv(s, sc, sd, d, rc, rd, dt, comm_, r)
                                     : loom_alltoallv(s, sc, sd, d, rc, rd, dt, comm_);
                        },
                        ON_STREAM(loom_alltoallv_stream, s, sc, sd, d, rc, rd, dt, comm_)}},
                   opts.asyncOp, counts);
    }

    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                            std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &opts) override
    {
        int size = getSize();
        TORCH_CHECK(outputs.size() == (size_t)size && inputs.size() == (size_t)size,
                    "loom: all_to_all: one input and one output tensor per rank");
        for (int i = 0; i < size; i++) {
            check_device(inputs[i], "all_to_all");
            check_device(outputs[i], "all_to_all");
            TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type() &&
                            outputs[i].scalar_type() == inputs[0].scalar_type(),
                        "loom: all_to_all: tensors must have one type");
        }
        auto w = make_work(OpType::ALLTOALL, outputs, "all_to_all", &inputs);
        at::Tensor src = flatten(inputs);
        int64_t total = 0;
        for (auto &o : outputs) {
            total += o.numel();
        }
        at::Tensor flat = at::empty({total}, inputs[0].options());
        w->keep_.insert(w->keep_.end(), {src, flat});
        auto counts = std::make_shared<std::vector<size_t>>(4 * (size_t)size);
        size_t *sc = counts->data(), *sd = sc + size, *rc = sd + size, *rd = rc + size;
        size_t so = 0, ro = 0;
        for (int i = 0; i < size; i++) {
            sc[i] = (size_t)inputs[i].numel();
            sd[i] = so;
            so += sc[i];
            rc[i] = (size_t)outputs[i].numel();
            rd[i] = ro;
            ro += rc[i];
        }
        std::vector<at::Tensor> outs = outputs;
        w->post_ = [flat, outs]() mutable { unflatten(flat, outs); };
        loom_dtype_t dt = to_loom_dtype(src);
        const void *s = src.data_ptr();
        void *d = flat.data_ptr();
        return run(w, {{[=, this](loom_request_t *r) {
                            (void)counts;
                            return r ? loom_ialltoallv(s, sc, sd, d, rc, rd, dt, comm_, r)
                                     : loom_alltoallv(s, sc, sd, d, rc, rd, dt, comm_);
                        },
                        ON_STREAM(loom_alltoallv_stream, s, sc, sd, d, rc, rd, dt, comm_)}},
                   opts.asyncOp, counts);
    }

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override
    {
        auto w = make_work(OpType::BARRIER, {}, "barrier");
        // Host-side on every device (opts.device may name a GPU): it has no
        // tensors, and run() first lets the stream's calls finish.
        return run(w, {{[this](loom_request_t *r) {
                           return r ? loom_ibarrier(comm_, r) : loom_barrier(comm_);
                       },
                       StreamCall()}},
                   opts.asyncOp);
    }

    // ---- Point to point. ----

    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst,
                                        int tag) override
    {
        at::Tensor t = single(tensors, "send");
        check_peer(dst, "send");
        auto w = make_work(OpType::SEND, {t}, "send");
        at::Tensor src = t.contiguous();
        w->keep_.push_back(src);
        loom_dtype_t dt = to_loom_dtype(src);
        size_t n = (size_t)src.numel();
        const void *p = src.data_ptr();
        int tg = tag < 0 ? 0 : tag;
        return run(w, {{[=, this](loom_request_t *r) {
                            return loom_isend(p, n, dt, dst, tg, comm_, r);
                        },
                        ON_STREAM(loom_send_stream, p, n, dt, dst, tg, comm_)}},
                   true, nullptr, /*p2p=*/true);
    }

    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src,
                                        int tag) override
    {
        return receive(tensors, src, tag);
    }

    // dist.recv(t) without src: Loom's receive from any rank sets the Work's
    // source rank before it completes (torch reads it through _source_rank()).
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors,
                                                 int tag) override
    {
        return receive(tensors, -1, tag);
    }

  private:
    struct Queue {
        std::mutex mu;
        std::condition_variable cv;
        std::deque<c10::intrusive_ptr<LoomWork>> q;
        bool stop = false;
    };

    // src -1: from whichever rank sends first.
    c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor> &tensors, int src, int tag)
    {
        at::Tensor t = single(tensors, "recv");
        if (src >= 0)
            check_peer(src, "recv");
        auto w = make_work(src >= 0 ? OpType::RECV : OpType::RECVANYSOURCE, {t}, "recv");
        at::Tensor dst = staged(w, t, false);
        loom_dtype_t dt = to_loom_dtype(dst);
        size_t n = (size_t)dst.numel();
        void *p = dst.data_ptr();
        int tg = tag < 0 ? 0 : tag;
        w->src_rank_ = src;
        int *source = &w->src_rank_;
        if (src < 0 && w->device_) {
            // Loom has no stream-ordered receive from any source.
            throw_backend_error("loom: recv without a source rank (from any source) is not "
                                "supported on CUDA tensors (got " + w->device_->str() +
                                "): name the source rank");
        }
        return run(w, {{[=, this](loom_request_t *r) {
                            return src >= 0 ? loom_irecv(p, n, dt, src, tg, comm_, r)
                                            : loom_irecv_any(p, n, dt, tg, source, comm_, r);
                        },
                        ON_STREAM(loom_recv_stream, p, n, dt, src, tg, comm_)}},
                   true, nullptr, /*p2p=*/true);
    }

    static at::Tensor single(std::vector<at::Tensor> &tensors, const char *what)
    {
        TORCH_CHECK(tensors.size() == 1, "loom: ", what,
                    " takes one tensor per process (got ", tensors.size(), ")");
        check_device(tensors[0], what);
        return tensors[0];
    }

    void check_peer(int peer, const char *what)
    {
        TORCH_CHECK(peer >= 0 && peer < getSize(), "loom: ", what, ": rank ", peer,
                    " is not in this group of ", getSize());
    }

    void check_list(const std::vector<at::Tensor> &list, const at::Tensor &like,
                    const char *what)
    {
        TORCH_CHECK(list.size() == (size_t)getSize(), "loom: ", what,
                    ": the list must hold one tensor per rank (", getSize(), "), got ",
                    list.size());
        for (auto &t : list) {
            check_device(t, what);
            TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(),
                        "loom: ", what, ": every tensor of the list must match the input's "
                        "size and type");
        }
    }

    static at::Tensor flatten(const std::vector<at::Tensor> &ts)
    {
        std::vector<at::Tensor> flat;
        for (auto &t : ts) {
            flat.push_back(t.reshape({-1}));
        }
        return at::cat(flat);
    }

    static void unflatten(const at::Tensor &flat, std::vector<at::Tensor> &outs)
    {
        int64_t off = 0;
        for (auto &o : outs) {
            o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
            off += o.numel();
        }
    }

    void split_counts(const at::Tensor &t, const std::vector<int64_t> &splits, size_t *counts,
                      size_t *displs, const char *what)
    {
        int size = getSize();
        int64_t rows = t.dim() > 0 ? t.size(0) : t.numel();
        int64_t per_row = rows > 0 ? t.numel() / rows : 0;
        size_t off = 0;
        if (splits.empty()) {
            TORCH_CHECK(rows % size == 0, "loom: all_to_all_single: the ", what,
                        "'s first dimension ", rows, " is not a multiple of the world size");
        } else {
            TORCH_CHECK(splits.size() == (size_t)size, "loom: all_to_all_single: ", what,
                        " splits must have one entry per rank");
        }
        int64_t sum = 0;
        for (int i = 0; i < size; i++) {
            int64_t rows_i = splits.empty() ? rows / size : splits[i];
            TORCH_CHECK(rows_i >= 0, "loom: all_to_all_single: negative split");
            sum += rows_i;
            counts[i] = (size_t)(rows_i * per_row);
            displs[i] = off;
            off += counts[i];
        }
        TORCH_CHECK(sum == rows, "loom: all_to_all_single: the ", what, " splits add up to ",
                    sum, ", not to the first dimension ", rows);
    }

    // The buffer Loom works on for t: t itself when contiguous, else a
    // contiguous copy (holding t's values when load) copied back into t after
    // success.
    at::Tensor staged(const c10::intrusive_ptr<LoomWork> &w, const at::Tensor &t, bool load)
    {
        if (t.is_contiguous()) {
            return t;
        }
        at::Tensor buf = load ? t.contiguous() : at::empty_like(t, at::MemoryFormat::Contiguous);
        w->keep_.push_back(buf);
        auto prev = w->post_;
        at::Tensor out = t;
        w->post_ = [prev, out, buf]() mutable {
            if (prev) {
                prev();
            }
            out.copy_(buf);
        };
        return buf;
    }

    // Allgather (root -1) or gather of src's elements into dst.
    Call gather_call(const at::Tensor &src, const at::Tensor &dst, int root)
    {
        loom_dtype_t dt = to_loom_dtype(src);
        size_t n = (size_t)src.numel();
        const void *s = src.data_ptr();
        void *d = dst.numel() ? dst.data_ptr() : nullptr;
        if (root < 0) {
            return {[=, this](loom_request_t *r) {
                        return r ? loom_iallgather(s, d, n, dt, comm_, r)
                                 : loom_allgather(s, d, n, dt, comm_);
                    },
                    ON_STREAM(loom_allgather_stream, s, d, n, dt, comm_)};
        }
        return {[=, this](loom_request_t *r) {
                    return r ? loom_igather(s, d, n, dt, root, comm_, r)
                             : loom_gather(s, d, n, dt, root, comm_);
                },
                ON_STREAM(loom_gather_stream, s, d, n, dt, root, comm_)};
    }

    // The operation's name in profiler events, Gloo's for each.
    static const char *profile_op(OpType type)
    {
        switch (type) {
        case OpType::BROADCAST: return "broadcast";
        case OpType::ALLREDUCE: return "all_reduce";
        case OpType::ALLREDUCE_COALESCED: return "all_reduce_coalesced";
        case OpType::REDUCE: return "reduce";
        case OpType::ALLGATHER: return "all_gather";
        case OpType::_ALLGATHER_BASE: return "all_gather_into_tensor";
        case OpType::ALLGATHER_COALESCED: return "all_gather_coalesced";
        case OpType::ALLGATHER_INTO_TENSOR_COALESCED: return "all_gather_into_tensor_coalesced";
        case OpType::GATHER: return "gather";
        case OpType::SCATTER: return "scatter";
        case OpType::REDUCE_SCATTER: return "reduce_scatter";
        case OpType::_REDUCE_SCATTER_BASE: return "reduce_scatter_tensor";
        case OpType::REDUCE_SCATTER_TENSOR_COALESCED: return "reduce_scatter_tensor_coalesced";
        case OpType::ALLTOALL_BASE: return "all_to_all";
        case OpType::ALLTOALL: return "all_to_all";
        case OpType::BARRIER: return "barrier";
        case OpType::SEND: return "send";
        case OpType::RECV:
        case OpType::RECVANYSOURCE: return "recv";
        default: return "unknown";
        }
    }

    // inputs: what the profiler records (the outputs where the operation
    // works in place).
    // more: the operation's other tensors (not recorded by the profiler),
    // for the device the operation runs on.
    c10::intrusive_ptr<LoomWork> make_work(OpType type, std::vector<at::Tensor> outputs,
                                           const char *what,
                                           const std::vector<at::Tensor> *inputs = nullptr,
                                           const std::vector<at::Tensor> *more = nullptr)
    {
        if (!comm_) {
            throw_backend_error(std::string("loom: rank ") + std::to_string(getRank()) + ": " +
                                what + " on a process group that was shut down");
        }
        std::optional<c10::Device> dev = call_device(what, outputs, inputs, more);
        seq_++;
        std::string title = profile_name_ + ":" + profile_op(type);
        std::vector<at::Tensor> ins = inputs ? *inputs : outputs;
        std::vector<c10::Device> devices;
        if (dev) {
            devices.push_back(*dev);
        }
        auto w = c10::make_intrusive<LoomWork>(getRank(), type, title, ins, std::move(outputs),
                                               what, std::move(devices));
        w->device_ = dev;
        if (dev) {
            // The caller may drop its tensors before the GPU is done with them.
            w->keep_ = ins;
            if (more) {
                w->keep_.insert(w->keep_.end(), more->begin(), more->end());
            }
        }
        return w;
    }

    // The CUDA device an operation's tensors are on, or none where they are
    // on the CPU. Tensors on the CPU and on a GPU, or on two GPUs, in one
    // call are an error naming both devices.
    static std::optional<c10::Device> call_device(const char *what,
                                                  const std::vector<at::Tensor> &a,
                                                  const std::vector<at::Tensor> *b,
                                                  const std::vector<at::Tensor> *c)
    {
        std::optional<c10::Device> first;
        for (const std::vector<at::Tensor> *l : {&a, b, c}) {
            if (!l) {
                continue;
            }
            for (const at::Tensor &t : *l) {
                if (!t.defined()) {
                    continue;
                }
                if (!first) {
                    first = t.device();
                } else if (t.device() != *first) {
                    throw_backend_error(std::string("loom: ") + what + ": tensors on " +
                                        first->str() + " and on " + t.device().str() +
                                        " in one call (all must be on the CPU, or all on one "
                                        "GPU)");
                }
            }
        }
        if (first && first->is_cuda()) {
            return first;
        }
        return std::nullopt;
    }

    // A failed operation, in torch's words where torch has some: a timeout
    // reads "Timed out waiting <ms>ms" as Gloo's, naming the group's timeout
    // (init_process_group's or new_group's timeout=, or pg_options), which is
    // the communicator's (Loom's own text names LOOM_TIMEOUT, its setting
    // outside torch).
    std::string failure(const std::string &what, loom_status_t st, const char *msg)
    {
        std::string detail = msg && *msg ? msg : "";
        std::string head = "loom: rank " + std::to_string(getRank()) + " of " +
                           std::to_string(getSize()) + ": " + what;
        if (st == LOOM_ERR_TIMEOUT) {
            const std::string env = "(LOOM_TIMEOUT)";
            for (size_t at; (at = detail.find(env)) != std::string::npos;) {
                detail.replace(at, env.size(), "(the process group's timeout)");
            }
            return head + ": Timed out waiting " + std::to_string(timeout_.count()) +
                   "ms (the process group's timeout) for " + what + " to complete: " + detail;
        }
        return head + " failed (" + loom_strerror(st) + "): " + detail;
    }

    // Start (or, when !async, run) w's calls. Their requests go to the
    // completion thread in the order Loom got them.
    c10::intrusive_ptr<c10d::Work> run(const c10::intrusive_ptr<LoomWork> &w,
                                       std::vector<Call> calls, bool async,
                                       std::shared_ptr<void> keep = nullptr, bool p2p = false)
    {
        (void)keep;
#ifdef LOOM_C10D_CUDA
        if (w->device_) {
            return run_on_stream(w, calls, p2p);
        }
#endif
        drain_stream();
        if (!async) {
            for (auto &call : calls) {
                loom_status_t st = call.host(nullptr);
                if (st != LOOM_SUCCESS) {
                    w->complete(backend_error(failure(w->what_, st, loom_comm_last_error(comm_))));
                    std::rethrow_exception(w->exception());
                }
            }
            w->complete(nullptr);
            return w;
        }
        Queue &q = p2p ? p2p_q_ : coll_q_;
        std::lock_guard<std::mutex> g(submit_mu_);
        for (auto &call : calls) {
            loom_request_t r = nullptr;
            loom_status_t st = call.host(&r);
            if (st != LOOM_SUCCESS) {
                std::string m = failure(w->what_, st, loom_comm_last_error(comm_));
                // Those already started still complete (their buffers are kept by w).
                if (w->reqs_.empty()) {
                    w->complete(backend_error(m));
                    std::rethrow_exception(w->exception());
                }
                w->start_error_ = m;
                break;
            }
            w->reqs_.push_back(r);
        }
        w->keep_alive_ = keep;
        {
            std::lock_guard<std::mutex> qg(q.mu);
            q.q.push_back(w);
        }
        q.cv.notify_one();
        return w;
    }

    void completion_loop(Queue &q)
    {
        for (;;) {
            c10::intrusive_ptr<LoomWork> w;
            {
                std::unique_lock<std::mutex> lk(q.mu);
                q.cv.wait(lk, [&] { return q.stop || !q.q.empty(); });
                if (q.q.empty()) {
                    return;   // stop, with everything drained
                }
                w = q.q.front();
                q.q.pop_front();
            }
            std::string err;
            for (loom_request_t r : w->reqs_) {
                loom_status_t st = loom_wait(r);
                if (st != LOOM_SUCCESS && err.empty()) {
                    err = failure(w->what_, st, loom_comm_last_error(comm_));
                }
            }
            w->reqs_.clear();
#ifdef LOOM_C10D_CUDA
            if (w->end_) {
                // Done when the stream is past the collective; a failure while
                // it ran is the communicator's stream status.
                try {
                    w->end_->synchronize();
                    loom_status_t st = loom_comm_stream_status(comm_);
                    if (st != LOOM_SUCCESS) {
                        err = failure(w->what_, st, loom_comm_last_error(comm_));
                    }
                } catch (const std::exception &e) {
                    err = "loom: rank " + std::to_string(getRank()) + ": " + w->what_ +
                          ": waiting for the GPU failed: " + e.what();
                }
            }
#endif
            if (err.empty()) {
                err = w->start_error_;
            }
            w->keep_alive_.reset();
            w->eptr_ = err.empty() ? nullptr : backend_error(err);
            hand_over(w);
        }
    }

    // Completing a future runs its then() callbacks in the completing thread,
    // and those may start another operation of this group and wait for it
    // (PowerSGD does): the completion threads must stay free to see that one
    // end. So futures are completed by a pool that grows a thread whenever
    // every thread in it is busy (Gloo gets the same from its worker threads).
    void hand_over(const c10::intrusive_ptr<LoomWork> &w)
    {
        std::lock_guard<std::mutex> g(pool_.mu);
        pool_.q.push_back(w);
        if (pool_.q.size() > (size_t)pool_.idle) {
            pool_.threads.emplace_back([this] { pool_loop(); });
        } else {
            pool_.cv.notify_one();
        }
    }

    void pool_loop()
    {
        std::unique_lock<std::mutex> lk(pool_.mu);
        for (;;) {
            while (pool_.q.empty() && !pool_.stop) {
                pool_.idle++;
                pool_.cv.wait(lk);
                pool_.idle--;
            }
            if (pool_.q.empty()) {
                return;
            }
            auto w = pool_.q.front();
            pool_.q.pop_front();
            lk.unlock();
            w->complete(w->eptr_);
            w.reset();
            lk.lock();
        }
    }

#ifdef LOOM_C10D_CUDA
    // A GPU operation: the backend's stream waits for the current stream (the
    // tensors' producer, and the staging copies the operation made there),
    // takes the Loom calls, then the copies out of staging buffers; an event
    // after those is what wait() orders the current stream after and what
    // the completion thread waits for. Nothing here blocks the host.
    c10::intrusive_ptr<c10d::Work> run_on_stream(const c10::intrusive_ptr<LoomWork> &w,
                                                 std::vector<Call> &calls, bool p2p)
    {
        c10::Device dev = *w->device_;
        c10::cuda::CUDAGuard guard(dev);
        c10::cuda::CUDAStream ours = stream_for(dev, w->what_);
        c10::Event ready(c10::DeviceType::CUDA);
        ready.record(c10::cuda::getCurrentCUDAStream(dev.index()));
        ready.block(ours);
        {
            std::lock_guard<std::mutex> g(submit_mu_);
            for (size_t i = 0; i < calls.size(); i++) {
                loom_status_t st = calls[i].stream(ours.stream());
                if (st != LOOM_SUCCESS) {
                    std::string m = failure(w->what_, st, loom_comm_last_error(comm_));
                    if (i == 0) {
                        w->complete(backend_error(m));
                        std::rethrow_exception(w->exception());
                    }
                    // Those already queued still run (their buffers are kept by w).
                    w->start_error_ = m;
                    break;
                }
            }
            stream_pending_ = true;
        }
        if (w->post_) {
            c10::cuda::CUDAStreamGuard sg(ours);
            w->post_();
            w->post_ = nullptr;
        }
        // Memory the caching allocator hands out again only after our stream
        // is done with it (the Work also holds the tensors until then).
        std::vector<at::Tensor> used = w->keep_;
        used.insert(used.end(), w->outputs_.begin(), w->outputs_.end());
        for (const at::Tensor &t : used) {
            if (t.defined() && t.is_cuda() && t.has_storage()) {
                c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), ours);
            }
        }
        w->stream_ = ours;
        w->end_ = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
        w->end_->record(ours);
        Queue &q = p2p ? p2p_q_ : coll_q_;
        {
            std::lock_guard<std::mutex> qg(q.mu);
            q.q.push_back(w);
        }
        q.cv.notify_one();
        return w;
    }

    // The backend's stream on dev (a communicator works on one device: the
    // first one given becomes the communicator's).
    c10::cuda::CUDAStream stream_for(c10::Device dev, const std::string &what)
    {
        std::lock_guard<std::mutex> g(stream_mu_);
        if (cuda_device_ < 0) {
            bind_device(dev.index());
        } else if (dev.index() != cuda_device_) {
            throw_backend_error("loom: rank " + std::to_string(getRank()) + ": " + what +
                                ": this process group works on cuda:" +
                                std::to_string(cuda_device_) + ", not on " + dev.str() +
                                " (one GPU per process group)");
        }
        if (!stream_) {
            stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, dev.index());
        }
        return *stream_;
    }
#endif

    // Make the communicator work on CUDA device (none where < 0).
    void bind_device(int device)
    {
        if (device < 0) {
            return;
        }
#ifdef LOOM_C10D_CUDA
        loom_status_t st = loom_comm_set_device(comm_, device);
        if (st != LOOM_SUCCESS) {
            throw_backend_error(failure("choosing cuda:" + std::to_string(device), st,
                                        loom_comm_last_error(comm_)));
        }
        cuda_device_ = device;
#else
        throw_backend_error("loom: this build of the backend has no CUDA support (cuda:" +
                            std::to_string(device) + ")");
#endif
    }

    // In a constructor: no destructor runs when it throws, so the
    // communicator goes here.
    void bind_or_destroy(int device)
    {
        try {
            bind_device(device);
        } catch (...) {
            loom_comm_destroy(comm_);
            comm_ = nullptr;
            throw;
        }
    }

    // Loom orders a call without a stream after the stream-ordered ones only
    // once the stream has reached them: wait for that first (nothing to do
    // unless a GPU operation was made).
    void drain_stream()
    {
#ifdef LOOM_C10D_CUDA
        if (!stream_pending_.exchange(false)) {
            return;
        }
        std::optional<c10::cuda::CUDAStream> s;
        {
            std::lock_guard<std::mutex> g(stream_mu_);
            s = stream_;
        }
        if (s) {
            c10::Stream(*s).synchronize();
        }
#endif
    }

    void stop_queue(Queue &q, std::thread &th)
    {
        {
            std::lock_guard<std::mutex> g(q.mu);
            q.stop = true;
        }
        q.cv.notify_all();
        if (th.joinable()) {
            th.join();
        }
    }

    void start_threads()
    {
        coll_thread_ = std::thread([this] { completion_loop(coll_q_); });
        p2p_thread_ = std::thread([this] { completion_loop(p2p_q_); });
    }

    void release()
    {
        std::lock_guard<std::mutex> g(life_mu_);
        if (!comm_) {
            return;
        }
        // Pending operations complete (or fail within the timeout) first.
        stop_queue(coll_q_, coll_thread_);
        stop_queue(p2p_q_, p2p_thread_);
        std::vector<std::thread> threads;
        {
            std::lock_guard<std::mutex> pg(pool_.mu);
            pool_.stop = true;
            threads.swap(pool_.threads);
        }
        pool_.cv.notify_all();
        for (auto &t : threads) {
            t.join();
        }
        drain_stream();   // calls the stream has not reached would fail
        loom_comm_destroy(comm_);
        comm_ = nullptr;
    }

    loom_comm_t comm_ = nullptr;
    c10::intrusive_ptr<c10d::Store> store_;
    std::chrono::milliseconds timeout_;
    std::atomic<uint64_t> seq_{0};
    std::string profile_name_;   // the profiler's events: "<this>:<operation>"
    uint64_t monitored_ = 0;
    std::mutex submit_mu_, life_mu_;
    Queue coll_q_, p2p_q_;
    struct Pool {
        std::mutex mu;
        std::condition_variable cv;
        std::deque<c10::intrusive_ptr<LoomWork>> q;
        std::vector<std::thread> threads;
        int idle = 0;
        bool stop = false;
    } pool_;
    std::thread coll_thread_, p2p_thread_;
    int cuda_device_ = -1;                   // the communicator's GPU, once chosen
    std::atomic<bool> stream_pending_{false};   // stream calls drain_stream() has not seen end
#ifdef LOOM_C10D_CUDA
    std::mutex stream_mu_;
    std::optional<c10::cuda::CUDAStream> stream_;   // where the GPU operations run
#endif
};

c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                         int size, double timeout_s,
                                         const std::string &profile_name, int device)
{
    auto ms = std::chrono::milliseconds((int64_t)(timeout_s * 1000.0));
    return c10::make_intrusive<LoomBackend>(store, rank, size, ms, profile_name, device);
}

} // namespace loom_c10d

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "Loom's torch.distributed backend (c10d::Backend over libloom)";
    m.def("create_backend", &loom_c10d::create, py::arg("store"), py::arg("rank"),
          py::arg("size"), py::arg("timeout_s"), py::arg("profile_name") = "loom",
          py::arg("device") = -1, py::call_guard<py::gil_scoped_release>(),
          "A Loom backend for a process group of size ranks (this one rank) that "
          "rendezvouses through store; profile_name names its profiler events "
          "(profile_name:all_reduce, ...); device, where >= 0, the CUDA device "
          "its GPU operations run on (else the first CUDA tensors')");
#ifdef LOOM_C10D_CUDA
    m.attr("cuda_built") = true;   // CUDA tensors go to Loom's stream-ordered calls
#else
    m.attr("cuda_built") = false;
#endif
}
