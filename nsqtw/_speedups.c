/*
 * _nsqtw_speedups: optional compiled versions of the functions of
 * nsqtw/core/message.py, nsqtw/protocol/wire.py and nsqtw/storage/segments.py
 * that run for every message a consumer reads or a disk queue holds.
 *
 *   frames(messages)          the MESSAGE frames of a batch, back to back
 *   decode_messages(records)  disk records as Message objects, or None when
 *                             one is too short (the caller then takes the
 *                             pure-Python path, which logs and skips it)
 *   message_ids(messages)     each message's ID, sliced out of its data
 *   start_flight(messages, ids, client, deadline)
 *                             a batch handed to a client: ID, attempts + 1,
 *                             client and deadline set on each message
 *   end_flight(live, owned, client, ids, timestamps)
 *                             a run of FINs: each message out of the in-flight
 *                             and per-client dicts, its client cleared
 *   fin_run(buffer, pos)      the IDs of the run of plain ``FIN <id>\n``
 *                             lines at ``pos`` (nsqtw/protocol/wire.py)
 *   split_mpub(data, left, total, max_msg, max_body, out)
 *                             the MPUB messages lying whole and valid at the
 *                             start of ``data`` (nsqtw/protocol/wire.py)
 *   split_records(buffer, max_records, min_size, max_size)
 *                             the whole, valid disk-queue records at the
 *                             start of a segment read (nsqtw/storage/segments.py)
 *   take_publish(buffer, pos, known, max_msg, max_body)
 *                             a whole, valid PUB or MPUB at ``pos`` whose topic
 *                             the connection already checked (nsqtw/protocol/wire.py)
 *   encode_new(timestamp, values, bodies)
 *                             nsqd's encoding of freshly published messages,
 *                             straight from their ID values and bodies
 *   frame_records(batch, start, room, min_size, max_size)
 *                             records as a segment holds them, as many as fit
 *                             (nsqtw/storage/segments.py)
 *
 * Those modules use this one when it is built and fall back to their own
 * definitions when it is not (or NSQTW_NO_SPEEDUPS is set): the two give
 * the same results, which tests/unit/test_message.py, test_wire.py and
 * test_segments.py check for both.
 *
 * Message is a Python class with __slots__; bind(Message) looks up where
 * each slot lives in the object once, so these functions read and fill the
 * slots directly, as the interpreter itself does, instead of going through
 * attribute lookup per field.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define MSG_ID_LENGTH 16
#define HEADER_LENGTH 10                          /* timestamp (8) + attempts (2) */
#define MIN_VALID_MSG_LENGTH (HEADER_LENGTH + MSG_ID_LENGTH)
#define FRAME_TYPE_MESSAGE 2
#define TOPIC_SEARCH 65                           /* a topic name (at most 64 bytes) and its newline */

static PyTypeObject *message_type = NULL;         /* the bound Message class */
static Py_ssize_t off_data, off_id, off_timestamp, off_attempts, off_client, off_deadline;
static PyObject *zero_deadline = NULL;            /* 0.0, shared as the interpreter shares the constant */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int
slot_offset(PyTypeObject *cls, const char *name, Py_ssize_t *offset)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)cls, name);
    if (descr == NULL)
        return -1;
    if (!PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", cls->tp_name, name);
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", cls->tp_name, name);
        return -1;
    }
    *offset = member->offset;
    Py_DECREF(descr);
    return 0;
}

static PyObject *
bind(PyObject *module, PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the Message class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    if (slot_offset(type, "data", &off_data) < 0 || slot_offset(type, "id", &off_id) < 0
            || slot_offset(type, "timestamp", &off_timestamp) < 0
            || slot_offset(type, "attempts", &off_attempts) < 0 || slot_offset(type, "client", &off_client) < 0
            || slot_offset(type, "deadline", &off_deadline) < 0)
        return NULL;
    Py_INCREF(cls);
    Py_XSETREF(message_type, type);
    Py_RETURN_NONE;
}

/* The check every function below starts with: Message is bound, and ``arg`` is a list. */
static int
bound_list(const char *fn, PyObject *arg)
{
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind(Message) first");
        return -1;
    }
    if (!PyList_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s() takes a list", fn);
        return -1;
    }
    return 0;
}

static inline void
put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static inline void
put_be64(unsigned char *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static inline uint64_t
get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static inline uint32_t
get_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* ``count`` integer arguments, ``args[first]`` on, as long long; -1 with the error set if one is not. */
static int
long_args(PyObject *const *args, Py_ssize_t first, Py_ssize_t count, long long *out)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        out[i] = PyLong_AsLongLong(args[first + i]);
        if (out[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

typedef struct {
    PyObject *data;         /* borrowed from the message, which the list keeps alive */
    int64_t timestamp;
    uint16_t attempts;
} part;

/* One message's fields, checked as struct.pack(">iiqH", ...) + data would check them. */
static int
read_message(PyObject *m, part *out)
{
    PyObject *data, *timestamp, *attempts;
    if (Py_TYPE(m) == message_type) {
        data = SLOT(m, off_data);
        timestamp = SLOT(m, off_timestamp);
        attempts = SLOT(m, off_attempts);
        if (data == NULL || timestamp == NULL || attempts == NULL) {
            PyErr_SetString(PyExc_AttributeError, "a Message without data, timestamp or attempts");
            return -1;
        }
    } else {
        PyErr_Format(PyExc_TypeError, "frames() takes Message objects, not %.100s", Py_TYPE(m)->tp_name);
        return -1;
    }
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "Message.data must be bytes");
        return -1;
    }
    if (!PyLong_Check(timestamp) || !PyLong_Check(attempts)) {  /* no __index__: no Python code runs */
        PyErr_SetString(PyExc_TypeError, "Message.timestamp and attempts must be int");
        return -1;
    }
    long long ts = PyLong_AsLongLong(timestamp);
    if (ts == -1 && PyErr_Occurred())
        return -1;
    long att = PyLong_AsLong(attempts);
    if (att == -1 && PyErr_Occurred())
        return -1;
    if (att < 0 || att > 0xFFFF) {
        PyErr_SetString(PyExc_OverflowError, "attempts out of range for uint16");
        return -1;
    }
    if (PyBytes_GET_SIZE(data) > INT32_MAX - 14) {
        PyErr_SetString(PyExc_OverflowError, "message too large for a frame");
        return -1;
    }
    out->data = data;
    out->timestamp = (int64_t)ts;
    out->attempts = (uint16_t)att;
    return 0;
}

static PyObject *
frames(PyObject *module, PyObject *messages)
{
    if (bound_list("frames", messages) < 0)
        return NULL;
    /* Nothing below runs Python code, so the list cannot change under us. */
    Py_ssize_t n = PyList_GET_SIZE(messages);
    part *parts = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(part));
    if (parts == NULL)
        return PyErr_NoMemory();
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (read_message(PyList_GET_ITEM(messages, i), &parts[i]) < 0) {
            PyMem_Free(parts);
            return NULL;
        }
        Py_ssize_t size = 4 + 4 + HEADER_LENGTH + PyBytes_GET_SIZE(parts[i].data);
        if (total > PY_SSIZE_T_MAX - size) {
            PyMem_Free(parts);
            return PyErr_NoMemory();
        }
        total += size;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        PyMem_Free(parts);
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len = PyBytes_GET_SIZE(parts[i].data);
        put_be32(p, (uint32_t)(4 + HEADER_LENGTH + len));
        put_be32(p + 4, FRAME_TYPE_MESSAGE);
        put_be64(p + 8, (uint64_t)parts[i].timestamp);
        p[16] = (unsigned char)(parts[i].attempts >> 8);
        p[17] = (unsigned char)parts[i].attempts;
        memcpy(p + 18, PyBytes_AS_STRING(parts[i].data), (size_t)len);
        p += 18 + len;
    }
    PyMem_Free(parts);
    return result;
}

static PyObject *
decode_messages(PyObject *module, PyObject *records)
{
    if (bound_list("decode_messages", records) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyBytes_Check(r) || PyBytes_GET_SIZE(r) < MIN_VALID_MSG_LENGTH)
            Py_RETURN_NONE;  /* the pure-Python path reports and skips the bad one */
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* Python code may run in here (an allocation can start a garbage collection),
           but nothing else holds ``out`` yet and every message is complete before the next. */
        PyObject *r = PyList_GET_ITEM(records, i);
        const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(r);
        PyObject *data = PyBytes_FromStringAndSize((const char *)buf + HEADER_LENGTH,
                                                   PyBytes_GET_SIZE(r) - HEADER_LENGTH);
        PyObject *timestamp = PyLong_FromLongLong((long long)(int64_t)get_be64(buf));
        PyObject *attempts = PyLong_FromLong(((long)buf[8] << 8) | buf[9]);
        PyObject *m = NULL;
        if (data != NULL && timestamp != NULL && attempts != NULL)
            m = message_type->tp_alloc(message_type, 0);
        if (m == NULL) {
            Py_XDECREF(data);
            Py_XDECREF(timestamp);
            Py_XDECREF(attempts);
            Py_DECREF(out);
            return NULL;
        }
        SLOT(m, off_data) = data;
        SLOT(m, off_timestamp) = timestamp;
        SLOT(m, off_attempts) = attempts;
        Py_INCREF(Py_None);
        SLOT(m, off_client) = Py_None;
        Py_INCREF(zero_deadline);
        SLOT(m, off_deadline) = zero_deadline;
        PyList_SET_ITEM(out, i, m);
    }
    return out;
}

static int
check_message(PyObject *m)
{
    if (Py_TYPE(m) != message_type) {
        PyErr_Format(PyExc_TypeError, "expected a Message, not %.100s", Py_TYPE(m)->tp_name);
        return -1;
    }
    PyObject *data = SLOT(m, off_data);
    if (data == NULL || !PyBytes_Check(data) || PyBytes_GET_SIZE(data) < MSG_ID_LENGTH) {
        PyErr_SetString(PyExc_ValueError, "a Message's data must be bytes of at least 16");
        return -1;
    }
    return 0;
}

static PyObject *
message_ids(PyObject *module, PyObject *messages)
{
    if (bound_list("message_ids", messages) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(messages);
    PyObject *ids = PyList_New(n);
    if (ids == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* only allocations below, and bytes objects run no Python code: the list stays as it is */
        PyObject *m = PyList_GET_ITEM(messages, i);
        if (check_message(m) < 0) {
            Py_DECREF(ids);
            return NULL;
        }
        PyObject *id = PyBytes_FromStringAndSize(PyBytes_AS_STRING(SLOT(m, off_data)), MSG_ID_LENGTH);
        if (id == NULL) {
            Py_DECREF(ids);
            return NULL;
        }
        PyList_SET_ITEM(ids, i, id);
    }
    return ids;
}

static PyObject *
start_flight(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "start_flight(messages, ids, client, deadline)");
        return NULL;
    }
    PyObject *messages = args[0], *ids = args[1], *client = args[2], *deadline = args[3];
    if (bound_list("start_flight", messages) < 0 || bound_list("start_flight", ids) < 0)
        return NULL;
    if (PyList_GET_SIZE(messages) != PyList_GET_SIZE(ids)) {
        PyErr_SetString(PyExc_ValueError, "start_flight() takes two lists of one length");
        return NULL;
    }
    /* Check everything first, so that a bad batch changes no message. */
    Py_ssize_t n = PyList_GET_SIZE(messages);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(messages, i);
        if (check_message(m) < 0)
            return NULL;
        PyObject *attempts = SLOT(m, off_attempts);
        if (attempts == NULL || !PyLong_Check(attempts)) {
            PyErr_SetString(PyExc_TypeError, "Message.attempts must be int");
            return NULL;
        }
    }
    /* Hold the batch: dropping a message's previous field values may run a
       finalizer, which could change the lists. */
    PyObject *held = PyList_GetSlice(messages, 0, n);
    PyObject *held_ids = PyList_GetSlice(ids, 0, n);
    if (held == NULL || held_ids == NULL) {
        Py_XDECREF(held);
        Py_XDECREF(held_ids);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(held, i);
        long attempts = PyLong_AsLong(SLOT(m, off_attempts));
        if (attempts == -1 && PyErr_Occurred()) {
            PyErr_Clear();  /* huge: Python's & 0xFFFF keeps the low bits */
            PyObject *mask = PyLong_FromLong(0xFFFF), *one = PyLong_FromLong(1), *next = NULL, *low = NULL;
            if (mask != NULL && one != NULL && (next = PyNumber_Add(SLOT(m, off_attempts), one)) != NULL)
                low = PyNumber_And(next, mask);
            Py_XDECREF(mask);
            Py_XDECREF(one);
            Py_XDECREF(next);
            if (low == NULL)
                goto fail;
            Py_SETREF(SLOT(m, off_attempts), low);
        } else {
            PyObject *low = PyLong_FromLong((long)(((unsigned long)attempts + 1UL) & 0xFFFFUL));
            if (low == NULL)
                goto fail;
            Py_SETREF(SLOT(m, off_attempts), low);
        }
        PyObject *id = PyList_GET_ITEM(held_ids, i);
        Py_INCREF(id);
        Py_XSETREF(SLOT(m, off_id), id);
        Py_INCREF(client);
        Py_XSETREF(SLOT(m, off_client), client);
        Py_INCREF(deadline);
        Py_XSETREF(SLOT(m, off_deadline), deadline);
    }
    Py_DECREF(held);
    Py_DECREF(held_ids);
    Py_RETURN_NONE;
fail:
    Py_DECREF(held);
    Py_DECREF(held_ids);
    return NULL;
}

/* Why a FIN fails, as nsqd words it (nsqtw/core/message.py's end_flight). */
static PyObject *not_in_flight = NULL, *not_owned = NULL;
static PyObject *pub_name = NULL, *mpub_name = NULL;    /* take_publish's command names */

static PyObject *
end_flight(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "end_flight(live, owned, client, ids, timestamps)");
        return NULL;
    }
    PyObject *live = args[0], *owned = args[1], *client = args[2], *ids = args[3], *timestamps = args[4];
    if (bound_list("end_flight", ids) < 0)
        return NULL;
    if (!PyDict_Check(live) || !PyDict_Check(owned)) {
        PyErr_SetString(PyExc_TypeError, "end_flight() takes two dicts");
        return NULL;
    }
    if (timestamps != Py_None && !PyList_Check(timestamps)) {
        PyErr_SetString(PyExc_TypeError, "end_flight() takes a list of timestamps or None");
        return NULL;
    }
    PyObject *failed = PyList_New(0);
    if (failed == NULL)
        return NULL;
    /* Hold the IDs: removing a message from the dicts may run a finalizer,
       which could change the caller's list. */
    Py_ssize_t n = PyList_GET_SIZE(ids);
    PyObject *held = PyList_GetSlice(ids, 0, n);
    if (held == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyList_GET_ITEM(held, i);
        PyObject *msg = PyDict_GetItemWithError(live, id);  /* borrowed */
        if (msg == NULL && PyErr_Occurred())
            goto fail;
        if (msg == NULL || Py_TYPE(msg) != message_type || SLOT(msg, off_client) != client) {
            if (msg != NULL && Py_TYPE(msg) != message_type) {
                PyErr_Format(PyExc_TypeError, "expected a Message, not %.100s", Py_TYPE(msg)->tp_name);
                goto fail;
            }
            PyObject *entry = PyTuple_Pack(2, id, msg == NULL ? not_in_flight : not_owned);
            if (entry == NULL || PyList_Append(failed, entry) < 0) {
                Py_XDECREF(entry);
                goto fail;
            }
            Py_DECREF(entry);
            continue;
        }
        Py_INCREF(msg);  /* live held the last reference, perhaps */
        if (PyDict_DelItem(live, id) < 0) {
            Py_DECREF(msg);
            goto fail;
        }
        if (PyDict_DelItem(owned, id) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                Py_DECREF(msg);
                goto fail;
            }
            PyErr_Clear();
        }
        Py_INCREF(Py_None);
        Py_XSETREF(SLOT(msg, off_client), Py_None);
        if (timestamps != Py_None) {
            PyObject *ts = SLOT(msg, off_timestamp);
            if (ts == NULL || PyList_Append(timestamps, ts) < 0) {
                if (ts == NULL)
                    PyErr_SetString(PyExc_AttributeError, "timestamp");
                Py_DECREF(msg);
                goto fail;
            }
        }
        Py_DECREF(msg);
    }
    Py_DECREF(held);
    return failed;
fail:
    Py_XDECREF(held);
    Py_DECREF(failed);
    return NULL;
}

#define FIN_LINE 21  /* "FIN " + 16-byte ID + "\n" */

/* One plain FIN line at p: "FIN ", 15 bytes that are neither space nor newline, one that is
   neither space, CR nor newline, then a newline (wire.py's _FIN_RUN, line by line). */
static int
plain_fin(const unsigned char *p)
{
    if (p[0] != 'F' || p[1] != 'I' || p[2] != 'N' || p[3] != ' ' || p[20] != '\n')
        return 0;
    for (int i = 4; i < 19; i++)
        if (p[i] == ' ' || p[i] == '\n')
            return 0;
    return p[19] != ' ' && p[19] != '\r' && p[19] != '\n';
}

/* ``args[0]`` as a buffer and ``args[1]`` as a position within it: 0, or -1 with an
   exception set (and nothing to release). While exported, a bytearray cannot be
   resized, so nothing run meanwhile (a collection, say) can change what ``view`` sees. */
static int
buffer_at(PyObject *const *args, Py_buffer *view, Py_ssize_t *pos)
{
    *pos = PyLong_AsSsize_t(args[1]);
    if (*pos == -1 && PyErr_Occurred())
        return -1;
    if (PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) < 0)
        return -1;
    if (*pos < 0 || *pos > view->len) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "pos out of range");
        return -1;
    }
    return 0;
}

static PyObject *
fin_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fin_run(buffer, pos)");
        return NULL;
    }
    Py_buffer view;
    Py_ssize_t pos;
    if (buffer_at(args, &view, &pos) < 0)
        return NULL;
    const unsigned char *base = (const unsigned char *)view.buf;
    Py_ssize_t n = 0;
    while (view.len - pos - n * FIN_LINE >= FIN_LINE && plain_fin(base + pos + n * FIN_LINE))
        n++;
    PyObject *ids = PyList_New(n);
    if (ids != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *id = PyBytes_FromStringAndSize((const char *)base + pos + i * FIN_LINE + 4, MSG_ID_LENGTH);
            if (id == NULL) {
                Py_CLEAR(ids);
                break;
            }
            PyList_SET_ITEM(ids, i, id);
        }
    }
    PyBuffer_Release(&view);
    return ids;
}

static PyObject *
split_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "split_records(buffer, max_records, min_size, max_size)");
        return NULL;
    }
    Py_ssize_t max_records = PyLong_AsSsize_t(args[1]);
    if (max_records == -1 && PyErr_Occurred())
        return NULL;
    long long sizes[2];
    if (long_args(args, 2, 2, sizes) < 0)
        return NULL;
    long long min_size = sizes[0], max_size = sizes[1];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *base = (const unsigned char *)view.buf;
    /* count first, so the list is made at its size */
    Py_ssize_t n = 0, off = 0;
    while (n < max_records && view.len - off >= 4) {
        long long size = (long long)(int32_t)get_be32(base + off);
        if (size < min_size || size > max_size || view.len - off - 4 < size)
            break;
        off += 4 + (Py_ssize_t)size;
        n++;
    }
    PyObject *out = PyList_New(n);
    if (out != NULL) {
        off = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t size = (Py_ssize_t)(int32_t)get_be32(base + off);
            PyObject *data = PyBytes_FromStringAndSize((const char *)base + off + 4, size);
            if (data == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, i, data);
            off += 4 + size;
        }
    }
    PyBuffer_Release(&view);
    if (out == NULL)
        return NULL;
    return Py_BuildValue("(Nn)", out, off);
}

static PyObject *
frame_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "frame_records(batch, start, room, min_size, max_size)");
        return NULL;
    }
    if (!PyList_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "frame_records: expected a list, not %.100s", Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    PyObject *batch = args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    long long limits[3];
    if (long_args(args, 2, 3, limits) < 0)
        return NULL;
    long long room = limits[0], min_size = limits[1], max_size = limits[2];
    Py_ssize_t n = PyList_GET_SIZE(batch);
    if (start < 0)
        start = 0;
    /* measure first; nothing below runs Python code, so the list stays as measured */
    Py_ssize_t i = start;
    long long used = 0;
    for (; i < n; i++) {
        PyObject *data = PyList_GET_ITEM(batch, i);
        if (!PyBytes_Check(data)) {
            PyErr_Format(PyExc_TypeError, "frame_records: a record must be bytes, not %.100s",
                         Py_TYPE(data)->tp_name);
            return NULL;
        }
        long long size = (long long)PyBytes_GET_SIZE(data);
        if (size < min_size || size > max_size || (i > start && used + 4 + size > room))
            break;
        used += 4 + size;
    }
    PyObject *framed = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)used);
    if (framed == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(framed);
    for (Py_ssize_t j = start; j < i; j++) {
        PyObject *data = PyList_GET_ITEM(batch, j);
        Py_ssize_t size = PyBytes_GET_SIZE(data);
        put_be32(p, (uint32_t)size);
        memcpy(p + 4, PyBytes_AS_STRING(data), (size_t)size);
        p += 4 + size;
    }
    return Py_BuildValue("(Nn)", framed, i - start);
}

/* nsqd's encoding of fresh messages (attempts 0) from their ID values and bodies. */
static PyObject *
encode_new(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char hex[] = "0123456789abcdef";
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_new(timestamp, values, bodies)");
        return NULL;
    }
    long long timestamp = PyLong_AsLongLong(args[0]);
    if (timestamp == -1 && PyErr_Occurred())
        return NULL;
    PyObject *bodies = PySequence_Fast(args[2], "encode_new: bodies must be a sequence");
    if (bodies == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(bodies);
    PyObject *values = PyObject_GetIter(args[1]);
    PyObject *out = values == NULL ? NULL : PyList_New(n);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* ``out`` is filled in order and nobody else holds it: a collection that runs
           in an allocation here never sees an unset item it would follow */
        PyObject *body = PySequence_Fast_GET_ITEM(bodies, i);
        if (!PyBytes_Check(body)) {
            PyErr_Format(PyExc_TypeError, "encode_new: a body must be bytes, not %.100s",
                         Py_TYPE(body)->tp_name);
            goto fail;
        }
        PyObject *value = PyIter_Next(values);
        if (value == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "encode_new: fewer values than bodies");
            goto fail;
        }
        unsigned long long v = PyLong_AsUnsignedLongLong(value);
        Py_DECREF(value);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        Py_ssize_t size = PyBytes_GET_SIZE(body);
        PyObject *record = PyBytes_FromStringAndSize(NULL, MIN_VALID_MSG_LENGTH + size);
        if (record == NULL)
            goto fail;
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(record);
        put_be64(p, (uint64_t)timestamp);
        p[8] = 0;
        p[9] = 0;
        for (int d = 0; d < MSG_ID_LENGTH; d++)
            p[HEADER_LENGTH + d] = (unsigned char)hex[(v >> (4 * (MSG_ID_LENGTH - 1 - d))) & 0xf];
        memcpy(p + MIN_VALID_MSG_LENGTH, PyBytes_AS_STRING(body), (size_t)size);
        PyList_SET_ITEM(out, i, record);
    }
    PyObject *extra = PyIter_Next(values);
    if (extra != NULL || PyErr_Occurred()) {
        Py_XDECREF(extra);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "encode_new: more values than bodies");
        goto fail;
    }
    Py_DECREF(values);
    Py_DECREF(bodies);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(values);
    Py_DECREF(bodies);
    return NULL;
}

/* The loop of split_mpub and take_publish: append to ``out`` up to ``*left`` MPUB messages
   lying whole and valid in ``buf[0:end]``; the bytes used, or -1 with an exception set.
   ``buf`` must not change meanwhile (immutable bytes, or an exported buffer). */
static Py_ssize_t
take_messages(const unsigned char *buf, Py_ssize_t end, long long *left, long long *total,
              long long max_msg, long long max_body, PyObject *out)
{
    Py_ssize_t pos = 0;
    while (*left > 0 && end - pos >= 4) {
        long long size = (long long)(int32_t)get_be32(buf + pos);
        Py_ssize_t start = pos + 4;
        if (size <= 0 || size > max_msg || *total + 4 + size > max_body || (long long)(end - start) < size)
            break;
        PyObject *msg = PyBytes_FromStringAndSize((const char *)buf + start, (Py_ssize_t)size);
        if (msg == NULL)
            return -1;
        int failed = PyList_Append(out, msg);
        Py_DECREF(msg);
        if (failed < 0)
            return -1;
        pos = start + (Py_ssize_t)size;
        *total += 4 + size;
        *left -= 1;
    }
    return pos;
}

/* A whole, valid ``PUB <topic>\n`` or ``MPUB <topic>\n`` at ``pos`` of a connection's
   buffer, its topic one the connection already checked (nsqtw/protocol/wire.py):
   (position past it, name, topic, bodies), or None. */
static PyObject *
take_publish(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "take_publish(buffer, pos, known, max_msg, max_body)");
        return NULL;
    }
    if (!PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "take_publish: known must be a dict");
        return NULL;
    }
    long long limits[2];
    if (long_args(args, 3, 2, limits) < 0)
        return NULL;
    long long max_msg = limits[0], max_body = limits[1];
    Py_buffer view;
    Py_ssize_t pos;
    if (buffer_at(args, &view, &pos) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t end = view.len;
    PyObject *topic = NULL, *bodies = NULL, *result = NULL;
    int mpub;
    Py_ssize_t start;
    if (end - pos >= 4 && memcmp(buf + pos, "PUB ", 4) == 0) {
        mpub = 0;
        start = pos + 4;
    } else if (end - pos >= 5 && memcmp(buf + pos, "MPUB ", 5) == 0) {
        mpub = 1;
        start = pos + 5;
    } else {
        goto none;
    }
    Py_ssize_t limit = end - start < TOPIC_SEARCH ? end - start : TOPIC_SEARCH;
    const unsigned char *nl = memchr(buf + start, '\n', (size_t)limit);
    if (nl == NULL)
        goto none;
    /* the checks of wire.py's _whole_publish_body, on the size at ``at``, before anything is made */
    Py_ssize_t line_end = nl - buf, at = line_end + 1, body_at = at + 4;
    if (end - at < 4)
        goto none;
    long long size = (long long)(int32_t)get_be32(buf + at), count = 1;
    if (!mpub) {
        if (size <= 0 || size > max_msg || (long long)(end - body_at) < size)
            goto none;
    } else {
        if (size < 4 || size > max_body || (long long)(end - body_at) < size)
            goto none;
        count = (long long)(int32_t)get_be32(buf + body_at);
        if (count <= 0 || count > (max_body - 4) / 5)
            goto none;
    }
    PyObject *raw = PyBytes_FromStringAndSize((const char *)buf + start, line_end - start);
    if (raw == NULL)
        goto done;
    topic = PyDict_GetItemWithError(args[2], raw);  /* borrowed */
    Py_DECREF(raw);
    if (topic == NULL) {
        if (PyErr_Occurred())
            goto done;
        goto none;
    }
    Py_INCREF(topic);  /* the dict is the caller's: keep the name alive whatever happens to it */
    Py_ssize_t past;
    if (!mpub) {
        if ((bodies = PyList_New(1)) == NULL)
            goto done;
        PyObject *body = PyBytes_FromStringAndSize((const char *)buf + body_at, (Py_ssize_t)size);
        if (body == NULL)
            goto done;
        PyList_SET_ITEM(bodies, 0, body);
        past = body_at + (Py_ssize_t)size;
    } else {
        if ((bodies = PyList_New(0)) == NULL)
            goto done;
        long long total = 4;
        Py_ssize_t used = take_messages(buf + body_at + 4, (Py_ssize_t)size - 4, &count, &total,
                                        max_msg, max_body, bodies);
        if (used < 0)
            goto done;
        if (count > 0)
            goto none;
        past = body_at + 4 + used;
    }
    result = Py_BuildValue("(nOOO)", past, mpub ? mpub_name : pub_name, topic, bodies);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(topic);
    Py_XDECREF(bodies);
    return result;
}

/* The MPUB messages lying whole and valid at the start of ``data`` (nsqtw/protocol/wire.py). */
static PyObject *
split_mpub(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "split_mpub(data, left, total, max_msg, max_body, out)");
        return NULL;
    }
    if (!PyBytes_Check(args[0]) || !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "split_mpub: data must be bytes and out a list");
        return NULL;
    }
    long long counts[4];
    if (long_args(args, 1, 4, counts) < 0)
        return NULL;
    long long left = counts[0], total = counts[1], max_msg = counts[2], max_body = counts[3];
    PyObject *data = args[0], *out = args[5];
    /* ``data`` is immutable and held by the caller: appending may run a collection, never change it */
    Py_ssize_t pos = take_messages((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                                   &left, &total, max_msg, max_body, out);
    if (pos < 0)
        return NULL;
    return Py_BuildValue("(nLL)", pos, left, total);
}

static PyMethodDef methods[] = {
    {"fin_run", (PyCFunction)(void (*)(void))fin_run, METH_FASTCALL,
     "fin_run(buffer, pos) -> the IDs of the plain FIN lines at pos."},
    {"message_ids", message_ids, METH_O, "message_ids(messages) -> list of each message's ID."},
    {"start_flight", (PyCFunction)(void (*)(void))start_flight, METH_FASTCALL,
     "start_flight(messages, ids, client, deadline): set each message's ID, attempts + 1, client, deadline."},
    {"split_records", (PyCFunction)(void (*)(void))split_records, METH_FASTCALL,
     "split_records(buffer, max_records, min_size, max_size) -> (records, bytes they take)."},
    {"frame_records", (PyCFunction)(void (*)(void))frame_records, METH_FASTCALL,
     "frame_records(batch, start, room, min_size, max_size) -> (framed records, how many)."},
    {"end_flight", (PyCFunction)(void (*)(void))end_flight, METH_FASTCALL,
     "end_flight(live, owned, client, ids, timestamps) -> [(id, why)] of the FINs that failed."},
    {"split_mpub", (PyCFunction)(void (*)(void))split_mpub, METH_FASTCALL,
     "split_mpub(data, left, total, max_msg, max_body, out) -> (bytes used, messages left, new total)."},
    {"take_publish", (PyCFunction)(void (*)(void))take_publish, METH_FASTCALL,
     "take_publish(buffer, pos, known, max_msg, max_body) -> (pos past it, name, topic, bodies) or None."},
    {"encode_new", (PyCFunction)(void (*)(void))encode_new, METH_FASTCALL,
     "encode_new(timestamp, values, bodies) -> nsqd's encoding of each fresh message."},
    {"bind", bind, METH_O, "bind(Message): learn where Message keeps its slots."},
    {"frames", frames, METH_O, "frames(messages) -> bytes: the MESSAGE frames of a batch."},
    {"decode_messages", decode_messages, METH_O,
     "decode_messages(records) -> list of Message, or None if a record is too short."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_nsqtw_speedups",
    "Optional compiled versions of nsqtw.core.message's per-message functions.", -1, methods,
};

PyMODINIT_FUNC
PyInit__nsqtw_speedups(void)
{
    zero_deadline = PyFloat_FromDouble(0.0);
    not_in_flight = PyUnicode_InternFromString("ID not in flight");
    not_owned = PyUnicode_InternFromString("client does not own message");
    pub_name = PyBytes_FromString("PUB");
    mpub_name = PyBytes_FromString("MPUB");
    if (zero_deadline == NULL || not_in_flight == NULL || not_owned == NULL || pub_name == NULL
            || mpub_name == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
