/* Unit tests of the handshake and frame-header parser: what a lying, confused
 * or foreign peer sends must be refused before a byte lands anywhere. */
#include <check.h>
#include <string.h>

#include "algorithms.h"
#include "check_suites.h"
#include "wire.h"

START_TEST(test_hello_roundtrip)
{
    loom_hello_t h = {LOOM_WIRE_VERSION, 3, 8, 0, 0x1111, 0x2222}, got;
    uint8_t buf[LOOM_HELLO_BYTES];
    loom_hello_encode(&h, buf);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 8, &got), LOOM_ACK_OK);
    ck_assert_uint_eq(got.rank, 3);
    ck_assert_uint_eq(got.size, 8);
}
END_TEST

START_TEST(test_hello_refusals)
{
    loom_hello_t h = {LOOM_WIRE_VERSION, 3, 8, 0, 0x1111, 0x2222}, got;
    uint8_t buf[LOOM_HELLO_BYTES];
    loom_hello_encode(&h, buf);
    ck_assert_int_eq(loom_hello_decode(buf, 0x9999, 0x2222, 1, 8, &got), LOOM_ACK_OTHER_JOB);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x9999, 1, 8, &got), LOOM_ACK_OTHER_JOB);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 4, &got), LOOM_ACK_BAD_SIZE);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 3, 8, &got), LOOM_ACK_BAD_RANK);
    h.rank = 8;
    loom_hello_encode(&h, buf);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 8, &got), LOOM_ACK_BAD_RANK);
    h.rank = 3;
    h.version = LOOM_WIRE_VERSION + 1;
    loom_hello_encode(&h, buf);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 8, &got), LOOM_ACK_BAD_VERSION);
    memcpy(buf, "GET / HTTP/1.1\r\n", 16);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 8, &got), LOOM_ACK_BAD_MAGIC);
}
END_TEST

START_TEST(test_ack)
{
    uint8_t buf[LOOM_ACK_BYTES];
    loom_ack_code_t code;
    uint32_t rank;
    loom_ack_encode(LOOM_ACK_DUPLICATE, 5, buf);
    ck_assert_int_eq(loom_ack_decode(buf, &code, &rank), 0);
    ck_assert_int_eq(code, LOOM_ACK_DUPLICATE);
    ck_assert_uint_eq(rank, 5);
    ck_assert_str_eq(loom_ack_reason(LOOM_ACK_OTHER_JOB), "belongs to another job or communicator");
    buf[8] = 200;  /* unknown reason code */
    ck_assert_int_eq(loom_ack_decode(buf, &code, &rank), -1);
    memset(buf, 'x', sizeof(buf));
    ck_assert_int_eq(loom_ack_decode(buf, &code, &rank), -1);
}
END_TEST

static loom_frame_t sample_frame(void)
{
    loom_frame_t f = {.kind = LOOM_FRAME_DATA, .len = 4096};
    f.match.tag = (UINT64_C(1) << 63) | 77;
    f.match.desc = loom_desc_make(LOOM_COLL_ALLREDUCE, LOOM_FLOAT32, LOOM_SUM);
    f.match.total = 1024;
    return f;
}

START_TEST(test_frame_roundtrip)
{
    loom_frame_t f = sample_frame(), g;
    uint8_t buf[LOOM_FRAME_BYTES];
    loom_err_t err = {0};
    loom_frame_encode(&f, buf);
    ck_assert_int_eq(loom_frame_decode(buf, 1, &g, &err), LOOM_SUCCESS);
    ck_assert_uint_eq(g.len, 4096);
    ck_assert(g.match.tag == f.match.tag);
    ck_assert_uint_eq(g.match.desc, f.match.desc);
    ck_assert(g.match.total == 1024);
}
END_TEST

START_TEST(test_frame_garbage)
{
    loom_frame_t f = sample_frame(), g;
    uint8_t buf[LOOM_FRAME_BYTES];
    loom_err_t err = {0};
    loom_frame_encode(&f, buf);
    buf[0] ^= 0xff;
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);
    ck_assert_ptr_nonnull(strstr(err.msg, "rank 2"));

    loom_frame_encode(&f, buf);
    buf[4] = 9;   /* unknown kind */
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);

    loom_frame_encode(&f, buf);
    buf[6] = 1;   /* reserved byte */
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);

    f.len = LOOM_FRAME_MAX_LEN + 1;   /* absurd length: refused before any allocation */
    loom_frame_encode(&f, buf);
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);

    loom_frame_t bye = {.kind = LOOM_FRAME_BYE, .len = 5};
    loom_frame_encode(&bye, buf);
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);
}
END_TEST

START_TEST(test_frame_check)
{
    loom_frame_t f = sample_frame();
    loom_tp_req_t posted = {.peer = 3, .len = 4096, .match = f.match};
    loom_err_t err = {0};
    ck_assert_int_eq(loom_frame_check(&f, &posted, 0, &err), LOOM_SUCCESS);

    posted.len = 4092;   /* the sender would overflow this buffer */
    ck_assert_int_eq(loom_frame_check(&f, &posted, 0, &err), LOOM_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "4096"));

    memset(&err, 0, sizeof(err));
    posted.len = 4096;
    posted.match.total = 1000;
    ck_assert_int_eq(loom_frame_check(&f, &posted, 0, &err), LOOM_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "count"));

    memset(&err, 0, sizeof(err));
    posted.match.total = 1024;
    posted.match.desc = loom_desc_make(LOOM_COLL_ALLREDUCE, LOOM_INT32, LOOM_SUM);
    ck_assert_int_eq(loom_frame_check(&f, &posted, 0, &err), LOOM_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "allreduce float32 sum"));
    ck_assert_ptr_nonnull(strstr(err.msg, "allreduce int32 sum"));
}
END_TEST

Suite *loom_wire_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_hello_roundtrip);
    tcase_add_test(tc, test_hello_refusals);
    tcase_add_test(tc, test_ack);
    tcase_add_test(tc, test_frame_roundtrip);
    tcase_add_test(tc, test_frame_garbage);
    tcase_add_test(tc, test_frame_check);
    suite_add_tcase(s, tc);
    return s;
}
