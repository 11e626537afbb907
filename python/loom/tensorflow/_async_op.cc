/*
 * LoomAsyncCall: a TensorFlow op that runs a Python callable of
 * loom.tensorflow (a collective) without holding one of TensorFlow's threads
 * while the collective waits for the other ranks.
 *
 * Why: tf.py_function blocks the inter-op thread that runs it until the body
 * returns. A graph holding more collectives than the pool has threads, started
 * in different orders on different ranks, then has every thread waiting on a
 * collective the other ranks have not started: they wait on each other until
 * LOOM_STALL_TIMEOUT fails them. An AsyncOpKernel returns from ComputeAsync at
 * once and calls done() later, so the pool keeps running the graph's other ops.
 *
 * How: ComputeAsync copies each input into a Python bytearray (NumPy wraps it
 * writable without another copy) and calls loom.tensorflow._async._start(key,
 * inputs, complete), which queues the callable registered under key on a
 * Python thread of its own and returns. That thread calls complete(outputs,
 * code, message) once: outputs as (shape, bytes) pairs, whose shapes are
 * known only then (allgather), or a TensorFlow error code and message. The
 * op's shapes are unknown here; loom.tensorflow sets them on the outputs.
 *
 * The library links no libpython: the Python C API resolves in the
 * interpreter that loaded it through tf.load_op_library.
 */
#include <Python.h>

#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

const char kCapsuleName[] = "loom.tensorflow._async_op.call";

// One running op: what complete() needs to finish it. The capsule that the
// Python completion holds owns it, so a completion called twice (a bug in
// _async.py) finds finished set instead of a freed context.
struct Call {
    OpKernelContext *ctx;
    AsyncOpKernel::DoneCallback done;
    bool finished = false;
};

void delete_call(PyObject *capsule)
{
    delete static_cast<Call *>(PyCapsule_GetPointer(capsule, kCapsuleName));
}

// The current Python exception as text ("Type: message"), cleared.
std::string python_error()
{
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyErr_NormalizeException(&type, &value, &trace);
    std::string text = "unknown Python error";
    if (value != nullptr) {
        PyObject *str = PyObject_Str(value);
        const char *s = str != nullptr ? PyUnicode_AsUTF8(str) : nullptr;
        const char *tname = type != nullptr ? reinterpret_cast<PyTypeObject *>(type)->tp_name : "?";
        text = std::string(tname) + ": " + (s != nullptr ? s : "?");
        Py_XDECREF(str);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(trace);
    PyErr_Clear();
    return text;
}

// Hands the op back to TensorFlow. done() may run the ops that were waiting on
// this one in this very thread, some of which take the GIL themselves (another
// LoomAsyncCall, a py_function): the GIL is let go meanwhile.
void finish(Call *call, const absl::Status &status)
{
    call->finished = true;
    if (!status.ok())
        call->ctx->SetStatus(status);
    AsyncOpKernel::DoneCallback done = std::move(call->done);
    call->ctx = nullptr;
    Py_BEGIN_ALLOW_THREADS
    done();
    Py_END_ALLOW_THREADS
}

// Sets output i from (shape, buffer); false with a Python exception set when
// they do not make the output's dtype and shape.
bool set_output(OpKernelContext *ctx, int i, PyObject *pair)
{
    PyObject *shape_obj, *data;
    if (!PyArg_ParseTuple(pair, "OO", &shape_obj, &data))
        return false;
    PyObject *dims = PySequence_Fast(shape_obj, "an output's shape must be a sequence");
    if (dims == nullptr)
        return false;
    TensorShape shape;
    bool ok = true;
    for (Py_ssize_t d = 0; ok && d < PySequence_Fast_GET_SIZE(dims); d++) {
        long long n = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims, d));
        if (n == -1 && PyErr_Occurred())
            ok = false;
        else if (!shape.AddDimWithStatus(n).ok()) {
            PyErr_Format(PyExc_ValueError, "output %d: bad dimension %lld", i, n);
            ok = false;
        }
    }
    Py_DECREF(dims);
    if (!ok)
        return false;

    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_C_CONTIGUOUS) != 0)
        return false;
    Tensor *out = nullptr;
    absl::Status st = ctx->allocate_output(i, shape, &out);
    if (st.ok() && static_cast<Py_ssize_t>(out->TotalBytes()) != view.len) {
        PyErr_Format(PyExc_ValueError, "output %d: %zd bytes for %lld bytes of %s%s", i, view.len,
                     static_cast<long long>(out->TotalBytes()),
                     tensorflow::DataTypeString(out->dtype()).c_str(), shape.DebugString().c_str());
        ok = false;
    } else if (!st.ok()) {
        PyErr_Format(PyExc_RuntimeError, "output %d: %s", i, std::string(st.message()).c_str());
        ok = false;
    } else if (view.len > 0) {
        std::memcpy(out->data(), view.buf, view.len);
    }
    PyBuffer_Release(&view);
    return ok;
}

// complete(outputs, code, message): the Python side's one call per op. code
// 0 sets outputs, a sequence of (shape, buffer) in the op's order; any other
// code is a TensorFlow error code (absl::StatusCode) failing the op.
PyObject *complete(PyObject *capsule, PyObject *args)
{
    PyObject *outputs;
    int code;
    const char *message;
    if (!PyArg_ParseTuple(args, "Ois", &outputs, &code, &message))
        return nullptr;
    Call *call = static_cast<Call *>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (call == nullptr)
        return nullptr;
    if (call->finished) {
        PyErr_SetString(PyExc_RuntimeError, "loom: an async op was completed twice");
        return nullptr;
    }
    if (code != 0) {
        finish(call, absl::Status(static_cast<absl::StatusCode>(code), message));
        Py_RETURN_NONE;
    }
    PyObject *seq = PySequence_Fast(outputs, "outputs must be a sequence");
    bool ok = seq != nullptr;
    if (ok && PySequence_Fast_GET_SIZE(seq) != call->ctx->num_outputs()) {
        PyErr_Format(PyExc_ValueError, "%zd outputs for an op of %d", PySequence_Fast_GET_SIZE(seq),
                     call->ctx->num_outputs());
        ok = false;
    }
    for (int i = 0; ok && i < call->ctx->num_outputs(); i++)
        ok = set_output(call->ctx, i, PySequence_Fast_GET_ITEM(seq, i));
    Py_XDECREF(seq);
    if (!ok) {
        // The op fails with the reason, and the Python caller learns it too.
        std::string why = python_error();
        finish(call, absl::InternalError("loom: bad outputs from an async op: " + why));
        PyErr_SetString(PyExc_ValueError, why.c_str());
        return nullptr;
    }
    finish(call, absl::OkStatus());
    Py_RETURN_NONE;
}

PyMethodDef complete_def = {"complete", complete, METH_VARARGS,
                            "complete(outputs, code, message): finish the op once"};

class LoomAsyncCallOp : public AsyncOpKernel {
public:
    explicit LoomAsyncCallOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx)
    {
        OP_REQUIRES_OK(ctx, ctx->GetAttr("key", &key_));
    }

    void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override
    {
        PyGILState_STATE gil = PyGILState_Ensure();
        Call *call = new Call{ctx, std::move(done)};
        PyObject *capsule = PyCapsule_New(call, kCapsuleName, delete_call);
        if (capsule == nullptr) {
            DoneCallback d = std::move(call->done);
            delete call;
            fail_now(ctx, std::move(d));
            PyGILState_Release(gil);
            return;
        }
        PyObject *fn = PyCFunction_New(&complete_def, capsule);
        PyObject *inputs = fn != nullptr ? make_inputs(ctx) : nullptr;
        PyObject *start = inputs != nullptr ? start_function() : nullptr;
        PyObject *res = nullptr;
        if (start != nullptr)
            res = PyObject_CallFunction(start, "LOO", static_cast<long long>(key_), inputs, fn);
        if (res == nullptr) {
            // _start never raises once it has queued the work, so the op is
            // still ours to finish.
            std::string why = python_error();
            if (!call->finished)
                finish(call, absl::InternalError("loom: cannot start an async op: " + why));
        }
        Py_XDECREF(res);
        Py_XDECREF(inputs);
        Py_XDECREF(fn);
        Py_DECREF(capsule);   // the call lives on while the Python side holds fn
        PyGILState_Release(gil);
    }

private:
    // Only when the capsule could not be made (no memory): no Python object
    // owns the call, so it finishes here.
    static void fail_now(OpKernelContext *ctx, DoneCallback done)
    {
        PyErr_Clear();
        ctx->SetStatus(absl::ResourceExhaustedError("loom: no memory for an async op"));
        Py_BEGIN_ALLOW_THREADS
        done();
        Py_END_ALLOW_THREADS
    }

    // [(bytearray, dtype enum, shape tuple)] for the inputs: copies, as the
    // input tensors are TensorFlow's again once the op is done.
    static PyObject *make_inputs(OpKernelContext *ctx)
    {
        PyObject *list = PyList_New(ctx->num_inputs());
        for (int i = 0; list != nullptr && i < ctx->num_inputs(); i++) {
            const Tensor &t = ctx->input(i);
            PyObject *shape = PyTuple_New(t.dims());
            for (int d = 0; shape != nullptr && d < t.dims(); d++)
                PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(t.dim_size(d)));
            auto data = t.tensor_data();
            PyObject *item = shape == nullptr ? nullptr :
                Py_BuildValue("(NiO)", PyByteArray_FromStringAndSize(data.data(), data.size()),
                              static_cast<int>(t.dtype()), shape);
            Py_XDECREF(shape);
            if (item == nullptr) {
                Py_CLEAR(list);
                break;
            }
            PyList_SET_ITEM(list, i, item);
        }
        return list;
    }

    // loom.tensorflow._async._start, imported once (under the GIL).
    static PyObject *start_function()
    {
        static PyObject *start = nullptr;
        if (start == nullptr) {
            PyObject *mod = PyImport_ImportModule("loom.tensorflow._async");
            if (mod != nullptr) {
                start = PyObject_GetAttrString(mod, "_start");
                Py_DECREF(mod);
            }
        }
        return start;
    }

    int64_t key_;
};

}  // namespace

REGISTER_OP("LoomAsyncCall")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    .Attr("key: int")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 0")
    // Never folded, pruned as a duplicate or run twice: it talks to other ranks.
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnknownShape)
    .Doc("Runs the loom.tensorflow callable registered under key on the inputs, "
         "holding no TensorFlow thread while it waits for the other ranks.");

REGISTER_KERNEL_BUILDER(Name("LoomAsyncCall").Device(tensorflow::DEVICE_CPU), LoomAsyncCallOp);
