/* tpdraft: DFlash / DFlash 2 block-diffusion drafters for speculative decoding, as a library
 * with a C ABI. A target engine opens a drafter once, opens a session per sequence, and calls
 * tpdraft_step once per decoding step with, for each sequence: the hidden states ("taps") of the
 * positions it just committed, how much of the drafter's context to keep, and the anchor token;
 * it gets back B - 1 draft tokens and the probabilities rejection sampling needs.
 *
 * Threading: every call on one drafter handle is serialised by the library (calls from several
 * threads wait for each other); different handles are independent. tpdraft_last_error() is per
 * thread. No call aborts the process, and no C++ exception crosses this interface.
 *
 * Errors: each call returns a tpdraft_status; on anything but TPDRAFT_OK, tpdraft_last_error()
 * says what and where (valid until the thread's next call). TPDRAFT_ERROR_ARGUMENT means nothing
 * changed: a step whose entry is wrong is refused before any session moves. */
#ifndef TPDRAFT_TPDRAFT_H
#define TPDRAFT_TPDRAFT_H

#include <stddef.h>
#include <stdint.h>

#define TPDRAFT_VERSION_MAJOR 0
#define TPDRAFT_VERSION_MINOR 3
#define TPDRAFT_VERSION_PATCH 0
#define TPDRAFT_VERSION_STRING "0.3.0"

#if defined(__GNUC__)
#define TPDRAFT_API __attribute__((visibility("default")))
#else
#define TPDRAFT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpdraft_status {
  TPDRAFT_OK = 0,
  TPDRAFT_ERROR_ARGUMENT = 1, /* an argument or a step entry is wrong; nothing changed */
  TPDRAFT_ERROR_INPUT = 2,    /* tpdraft_open: the checkpoint or an option cannot be used */
  TPDRAFT_ERROR_RUNTIME = 3,  /* a failure while working (memory, a device, a rank): the handle
                                 may be unusable; tpdraft_close is always safe */
  TPDRAFT_ERROR_UNAVAILABLE = 4, /* a client only: the server did not answer within the timeout, the
                                   connection is gone or the server is shutting down; the client
                                   is closed for good (every later call fails the same way) */
  TPDRAFT_ERROR_BUSY = 5         /* a client only: the server's queue of steps was full and did not take
                                   this one; nothing changed and the client stays open: step again
                                   later, or decode this step without drafts */
} tpdraft_status;

/* The library's version, "MAJOR.MINOR.PATCH"; compare with TPDRAFT_VERSION_STRING. */
TPDRAFT_API const char* tpdraft_version(void);
/* The reason of the calling thread's last failed call ("" when none). */
TPDRAFT_API const char* tpdraft_last_error(void);
/* "ok", "argument", "input", "runtime", "unavailable" or "busy" ("unknown" for any other value). */
TPDRAFT_API const char* tpdraft_status_name(int status);

/* Logging. The library writes warnings and errors to stderr, one line each ("[time] [rank r/w]
 * [level] message"); TPDRAFT_LOG_LEVEL (trace, debug, info, warn, error, critical, off; any case)
 * or tpdraft_set_log_level chooses another level, and a callback may take the lines instead. */
typedef enum tpdraft_log_level {
  TPDRAFT_LOG_TRACE = 0, TPDRAFT_LOG_DEBUG = 1, TPDRAFT_LOG_INFO = 2, TPDRAFT_LOG_WARN = 3,
  TPDRAFT_LOG_ERROR = 4, TPDRAFT_LOG_CRITICAL = 5, TPDRAFT_LOG_OFF = 6
} tpdraft_log_level;
/* Sets the level by name (the names of TPDRAFT_LOG_LEVEL); over the variable, for this process.
 * TPDRAFT_ERROR_ARGUMENT for an unknown name (or NULL), the level unchanged. */
TPDRAFT_API tpdraft_status tpdraft_set_log_level(const char* level);
/* Each line (a tpdraft_log_level, the line without its newline, user) goes to callback instead
 * of stderr; NULL: back to stderr. The callback runs on the thread that logs (a rank's thread
 * too), one line at a time; it must not call tpdraft_set_log_callback (refused with
 * TPDRAFT_ERROR_ARGUMENT when it does). line is valid during the call only. */
typedef void (*tpdraft_log_callback)(int level, const char* line, void* user);
TPDRAFT_API tpdraft_status tpdraft_set_log_callback(tpdraft_log_callback callback, void* user);

typedef struct tpdraft_drafter tpdraft_drafter;
typedef int64_t tpdraft_session;

typedef enum tpdraft_dtype { TPDRAFT_F32 = 0, TPDRAFT_BF16 = 1, TPDRAFT_F16 = 2 } tpdraft_dtype;

typedef struct tpdraft_options {
  uint32_t struct_size;      /* sizeof(tpdraft_options); set by tpdraft_options_init */
  const char* backend;       /* "cpu", "cuda" or "auto" (NULL: "auto": cuda when a GPU is visible) */
  int32_t threads;           /* CPU threads per rank; 0: this machine's cores shared among the ranks */
  int32_t tp;                /* tensor-parallel ranks in this process (threads); 0 or 1: one */
  int32_t max_sessions;      /* entries one step may hold (default 8) */
  int64_t max_context;       /* positions one session may hold (default 4096) */
  int32_t max_open_sessions; /* sessions open at once (default 64) */
  int32_t graphs;            /* capture the block forward and replay it: -1 auto (on for cuda), 0, 1 */
  const char* quant;         /* NULL: weights as stored; "q8" or "q4": quantize a float checkpoint while
                                loading (q8: every matrix int8; q4: layer matrices int4, fc and the
                                projections int8; cpu and cuda backends; docs/quantization.md); "a8" or
                                "a16" after the bits picks int8 or float activations ("q8a8", "q4a16");
                                a "+head" suffix holds the target's head int8 as well ("q8+head") */
  const char* token_map;     /* NULL: the head scores every token; else a token map file (a JSON list of
                                target ids, or safetensors with an I64 'token_ids'; docs/checkpoint.md):
                                draft over those ids only, the head cut to their rows at load */
  const int64_t* token_ids;  /* the same map held in memory: n_token_ids target ids, any order (repeats
                                are dropped); read during tpdraft_open only. At most one of token_map
                                and token_ids */
  int64_t n_token_ids;
  const char* kv_dtype;      /* the context cache's element type: NULL or "f32"; "bf16": half the memory
                                a session holds and the bytes a draft reads, its rounding error bounded
                                in docs/model.md (cpu backend only for now) */
} tpdraft_options;

/* Fills the defaults; call it, then change what you need. */
TPDRAFT_API void tpdraft_options_init(tpdraft_options* options);

/* Loads DRAFTER_DIR (config.json + safetensors) and the target's embedding and head from
 * TARGET_DIR, every rank's share; *out is NULL on failure. options may be NULL (defaults). */
TPDRAFT_API tpdraft_status tpdraft_open(const char* drafter_dir, const char* target_dir,
                                        const tpdraft_options* options, tpdraft_drafter** out);
/* Frees the drafter and every session it holds. NULL is allowed. A call in flight on another
 * thread finishes first (tpdraft_close waits for it); no call may begin once tpdraft_close has
 * been called, nor use the handle after. */
TPDRAFT_API void tpdraft_close(tpdraft_drafter* drafter);

typedef struct tpdraft_caps {
  uint32_t struct_size;             /* set it to sizeof(tpdraft_caps) before the call */
  const char* architecture;         /* the config's architectures[0]: "DFlashDraftModel", "DFlash2DraftModel",
                                       or a speculators checkpoint's ("DFlashSpeculator") */
  const char* backend;              /* "cpu" or "cuda" */
  int32_t block_size;               /* B: a step drafts B - 1 tokens per entry */
  int32_t tp;
  int64_t taps_width;               /* T * H: floats in one tap row */
  int64_t hidden_size;              /* H */
  int64_t vocab_size;               /* V: draft tokens lie in [0, V) */
  int64_t mask_token_id;
  int32_t n_target_layers;          /* T */
  const int64_t* target_layer_ids;  /* [T]: a tap row is the target's hidden states after these
                                       layers (0-based; HF hidden_states[id + 1]), concatenated */
  int32_t max_sessions;
  int32_t max_open_sessions;
  int64_t max_context;
  int64_t draft_vocab_size;         /* N: the target ids the head scores (a draft vocabulary: a token map
                                       or a speculators checkpoint's d2t); V when it scores all. Drafts
                                       and distributions are in target ids either way */
} tpdraft_caps;

/* The strings and arrays stay valid while the drafter is open. */
TPDRAFT_API tpdraft_status tpdraft_caps_get(const tpdraft_drafter* drafter, tpdraft_caps* out);

TPDRAFT_API tpdraft_status tpdraft_session_open(tpdraft_drafter* drafter, tpdraft_session* out);
TPDRAFT_API tpdraft_status tpdraft_session_close(tpdraft_drafter* drafter, tpdraft_session session);
/* Positions the session holds: the next anchor sits at this position. */
TPDRAFT_API tpdraft_status tpdraft_session_length(tpdraft_drafter* drafter, tpdraft_session session, int64_t* out);

typedef struct tpdraft_sampling {
  double temperature; /* 0: greedy (ties to the lower id); > 0: a seeded draw */
  int64_t top_k;      /* 0: off (DFlash only; a DFlash 2 drafter draws among its selector's candidates) */
  double top_p;       /* 1: off (DFlash only) */
  uint64_t seed;      /* the same seed, context and anchor give the same draft */
} tpdraft_sampling;

/* dist_width value for the probability of every token of the vocabulary. On a sampled DFlash
 * draft it gathers every rank's logits each step (V floats per row per rank). */
#define TPDRAFT_DIST_FULL (-1)

typedef struct tpdraft_step_entry {
  /* in */
  tpdraft_session session;
  int64_t keep;            /* first roll the session back to this length (what the target
                              accepted); -1: keep everything it holds */
  int64_t p0;              /* position of the first new tap row; -1: the length after keep */
  int64_t n_new;           /* new tap rows, for positions p0 .. p0 + n_new - 1 */
  const void* taps;        /* [n_new, taps_width] in taps_dtype, row-major; read during the call */
  int32_t taps_dtype;      /* a tpdraft_dtype (an int32_t, so that the struct's layout does not
                              depend on the compiler's size for enums) */
  int32_t taps_on_device;  /* 1: taps is device memory of the cuda backend (any taps_dtype), written
                              on taps_stream; the drafter's stream waits for it */
  void* taps_stream;       /* a cudaStream_t, or NULL */
  int64_t anchor;          /* the token at position p0 + n_new (the target's last committed token) */
  tpdraft_sampling sampling;
  int64_t dist_width;      /* 0: no distribution; w > 0: each row's w most likely tokens; or
                              TPDRAFT_DIST_FULL */
  /* out: buffers the caller owns */
  int64_t* tokens;         /* [B - 1]: the drafts of positions p0 + n_new + 1 ... (required) */
  float* q;                /* [B - 1]: the probability the drafter gave each (1 when greedy), or NULL */
  int64_t* dist_ids;       /* [B - 1, w]: ids by probability, -1 past a narrower support (w > 0) */
  float* dist_probs;       /* [B - 1, w], or [B - 1, V] for TPDRAFT_DIST_FULL */
  float* dist_rest;        /* [B - 1]: the mass outside the w listed, or NULL */
} tpdraft_step_entry;

/* Fills an entry with what changes nothing: keep = -1, p0 = -1, no rows, greedy (top_p = 1),
 * no distribution, no buffers. Set the session, the anchor, the taps and the buffers after it. */
TPDRAFT_API void tpdraft_step_entry_init(tpdraft_step_entry* entry);

/* For each entry: roll back to keep, settle the new rows, draft one block from the anchor; all
 * entries in one batched forward. Every entry is checked first (an unknown or repeated session,
 * taps missing or holding NaN, keep or p0 beyond what the session holds, an anchor outside the
 * vocabulary, bad sampling, a missing output buffer): a bad entry fails the whole step with
 * TPDRAFT_ERROR_ARGUMENT naming it, and no session changes. count must lie in 1..max_sessions;
 * it is checked before any entry is read. */
TPDRAFT_API tpdraft_status tpdraft_step(tpdraft_drafter* drafter, tpdraft_step_entry* entries, size_t count);

/* Where the last successful tpdraft_step on this handle spent its time, in seconds (rank 0's). */
typedef struct tpdraft_step_times {
  double settle_seconds; /* roll-backs and settling the new tap rows */
  double draft_seconds;  /* the batched draft: forward, head, token choice */
  double total_seconds;  /* the whole call: checks, the above, hand-offs between ranks, copies out */
} tpdraft_step_times;
TPDRAFT_API tpdraft_status tpdraft_last_step_times(tpdraft_drafter* drafter, tpdraft_step_times* out);

/* ---- A served drafter: `tpdraft serve` (docs/protocol.md) ----------------------------------
 * A client has the same calls as the in-process drafter, so that an engine switches between the
 * two by the line that opens the handle. Every call waits at most timeout_seconds for the server;
 * one that gets no answer (the server stopped, a rank failed, the connection is gone) returns
 * TPDRAFT_ERROR_UNAVAILABLE and closes the client for good: it "fails closed". A failed
 * tpdraft_client_step leaves no drafts: every entry it checked (all of them, unless the count or
 * an entry was refused: then those before the refused one) has tokens -1 and q 0, so an engine
 * that decodes on without the drafter accepts nothing from it. Over ipc:// the client writes the
 * taps into a shared-memory ring the server maps (no copy through the socket); over tcp:// they
 * travel inside the request. Calls on one client are serialised; use one client per thread for
 * concurrency (the server batches the steps of many clients into one forward). */
typedef struct tpdraft_client tpdraft_client;

typedef struct tpdraft_client_options {
  uint32_t struct_size;     /* sizeof(tpdraft_client_options); set by tpdraft_client_options_init */
  double timeout_seconds;   /* the longest a call waits for the server (default 10) */
  int32_t shared_memory;    /* taps through a shared-memory ring: -1 auto (for ipc:// addresses), 0, 1 */
  int64_t ring_bytes;       /* the ring's size (default 64 MiB; a step whose taps do not fit sends
                               them inline) */
  const char* server_key;   /* NULL, or the public CURVE key of a server started with
                               --curve-secret-key: the 40-character key or the file holding it
                               (NAME.public of tpdraft keys). The connection is then encrypted and
                               reaches only the server that holds the matching secret key */
} tpdraft_client_options;

TPDRAFT_API void tpdraft_client_options_init(tpdraft_client_options* options);
/* Connects to ADDRESS (ipc://PATH or tcp://HOST:PORT, as `tpdraft serve` printed it) and asks
 * the server's caps (HELLO); *out is NULL on failure. options may be NULL (defaults). */
TPDRAFT_API tpdraft_status tpdraft_client_open(const char* address, const tpdraft_client_options* options,
                                               tpdraft_client** out);
/* Closes the client's sessions on the server (a short wait) and frees it. NULL is allowed. As
 * with tpdraft_close, a call in flight on another thread finishes first, and no call may begin
 * once tpdraft_client_close has been called. */
TPDRAFT_API void tpdraft_client_close(tpdraft_client* client);
/* As tpdraft_caps_get; the strings and arrays stay valid while the client is open. */
TPDRAFT_API tpdraft_status tpdraft_client_caps_get(const tpdraft_client* client, tpdraft_caps* out);
TPDRAFT_API tpdraft_status tpdraft_client_session_open(tpdraft_client* client, tpdraft_session* out);
TPDRAFT_API tpdraft_status tpdraft_client_session_close(tpdraft_client* client, tpdraft_session session);
TPDRAFT_API tpdraft_status tpdraft_client_session_length(tpdraft_client* client, tpdraft_session session, int64_t* out);
/* As tpdraft_step (host taps only: taps_on_device must be 0). */
TPDRAFT_API tpdraft_status tpdraft_client_step(tpdraft_client* client, tpdraft_step_entry* entries, size_t count);
/* settle and draft: the server's forward that held the last step; total: the whole call here. */
TPDRAFT_API tpdraft_status tpdraft_client_last_step_times(tpdraft_client* client, tpdraft_step_times* out);

/* What the server has done since it started (STATS). */
typedef struct tpdraft_server_stats {
  uint64_t clients;         /* clients known now */
  uint64_t open_sessions;   /* over every client */
  uint64_t forwards;        /* batched forwards run */
  uint64_t steps;           /* STEP requests answered by them */
  uint64_t entries;         /* entries drafted */
  uint64_t errors;          /* requests refused */
  uint64_t max_batch;       /* the most entries one forward held */
  uint64_t clients_reaped;  /* clients whose sessions were closed after --idle-timeout */
  double uptime_seconds;
} tpdraft_server_stats;
TPDRAFT_API tpdraft_status tpdraft_client_stats(tpdraft_client* client, tpdraft_server_stats* out);
/* Asks the server to stop after the forward in flight (as SIGTERM does). */
TPDRAFT_API tpdraft_status tpdraft_client_shutdown(tpdraft_client* client);
/* 1 when this client's taps go through the shared-memory ring, else 0. */
TPDRAFT_API int32_t tpdraft_client_shared_memory(const tpdraft_client* client);

#ifdef __cplusplus
}
#endif

#endif /* TPDRAFT_TPDRAFT_H */
