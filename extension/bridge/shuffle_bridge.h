/*
 * shuffle_bridge.h: the C interface between the shuffle's PostgreSQL glue (shuffle/) and the
 * rdma library's exchange (rdma/include/slipstream/rdma/exchange.h). Like bridge.h: no
 * PostgreSQL headers behind it, every call catches C++ exceptions and returns a code, and
 * failure messages go into a caller's buffer of SS_SHUFFLE_ERROR_SIZE bytes.
 */
/* clang-format off */
#ifndef SLIPSTREAM_SHUFFLE_BRIDGE_H
#define SLIPSTREAM_SHUFFLE_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SS_SHUFFLE_ERROR_SIZE 512

/* Result codes of the calls that can also "not now". */
#define SS_SHUFFLE_OK 0
#define SS_SHUFFLE_WOULD_BLOCK 1
#define SS_SHUFFLE_NOTHING 1
#define SS_SHUFFLE_ERROR (-1)
#define SS_SHUFFLE_AUTH_FAILED (-2)

typedef struct SsShuffle SsShuffle;
typedef struct SsShuffleBatch SsShuffleBatch;

/* Opens this participant's listener on HOST, any port; *port receives the port bound. */
SsShuffle  *ss_shuffle_listen(const char *host, const char *transport, const char *secret,
							  uint32_t *port, char *error);

/*
 * Joins the exchange `id` as participant `self` of `n`, whose listeners are at addresses[]
 * ("HOST:PORT"; self's entry unused). Returns SS_SHUFFLE_OK, SS_SHUFFLE_AUTH_FAILED or
 * SS_SHUFFLE_ERROR.
 */
int			ss_shuffle_connect(SsShuffle *shuffle, uint64_t id, uint32_t self,
							   const char *const *addresses, uint32_t n, uint32_t receive_buffers,
							   uint32_t buffer_size, int timeout_ms, char *error);

/* The most bytes of encoded rows one batch may hold, for the arena's size. */
uint64_t	ss_shuffle_max_batch(const SsShuffle *shuffle);

/*
 * Registers the buffer that batches to `target` are staged in, with that peer only (once; it
 * must stay until the close).
 */
int			ss_shuffle_set_source(SsShuffle *shuffle, uint32_t target, void *buffer, size_t length,
								  char *error);

/*
 * Stages a batch for `target`: `rows` rows lying back to back from the start of its buffer,
 * row i lengths[i] bytes long, as a pointer-mapped region.
 */
int			ss_shuffle_stage(SsShuffle *shuffle, uint32_t target, const uint32_t *lengths,
							 uint32_t rows, char *error);

/* Sends the staged rows `target` owns (nothing if none): SS_SHUFFLE_OK, _WOULD_BLOCK or _ERROR. */
int			ss_shuffle_try_send(SsShuffle *shuffle, uint32_t target, char *error);

/* Ends the stream to `target`: SS_SHUFFLE_OK, _WOULD_BLOCK or _ERROR. */
int			ss_shuffle_try_end(SsShuffle *shuffle, uint32_t target, char *error);

/*
 * The next message from any peer within timeout_ms: SS_SHUFFLE_OK with *batch set (rows) or
 * *end_from set to the peer that ended (and *batch NULL), SS_SHUFFLE_NOTHING, or _ERROR.
 */
int			ss_shuffle_receive(SsShuffle *shuffle, int timeout_ms, SsShuffleBatch **batch,
							   int *end_from, char *error);

/* Whether every peer has ended its stream. */
bool		ss_shuffle_all_ended(const SsShuffle *shuffle);

/* After every end both ways: confirms with every peer that everything arrived. */
int			ss_shuffle_finish(SsShuffle *shuffle, int timeout_ms, char *error);

/* The peer a batch came from. */
uint32_t	ss_shuffle_batch_from(const SsShuffleBatch *batch);

/* The batch's next row; false after the last. */
bool		ss_shuffle_batch_next(SsShuffleBatch *batch, const char **data, uint32_t *length);

void		ss_shuffle_batch_free(SsShuffleBatch *batch);

/* Traffic with `peer`: batches, payload and wire bytes sent, then the same received. */
void		ss_shuffle_counters(const SsShuffle *shuffle, uint32_t peer, uint64_t out[6]);

/* Disconnects from every peer and frees everything (NULL is fine). */
void		ss_shuffle_close(SsShuffle *shuffle);

#ifdef __cplusplus
}
#endif

#endif
