/* A plain C program against libtpdraft: open a drafter, read its caps, open a session and run a
 * few decoding steps on made-up hidden states, printing the drafted tokens. A real engine passes
 * its target model's hidden states and committed tokens where this one makes them up.
 * Usage: draft DRAFTER_DIR TARGET_DIR [STEPS] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <tpdraft/tpdraft.h>

/* Prints the failed call and the library's reason, and ends the program. */
static void check(tpdraft_status status, const char* call) {
  if (status == TPDRAFT_OK) return;
  fprintf(stderr, "%s failed (%s): %s\n", call, tpdraft_status_name(status), tpdraft_last_error());
  exit(1);
}

/* rows x width floats in [-1, 1), from a small xorshift generator. */
static void make_taps(float* taps, int64_t count, uint64_t* state) {
  for (int64_t i = 0; i < count; ++i) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    taps[i] = (float)((double)(*state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s DRAFTER_DIR TARGET_DIR [STEPS]\n", argv[0]);
    return 2;
  }
  const int steps = argc > 3 ? atoi(argv[3]) : 4;

  tpdraft_options options;
  tpdraft_options_init(&options);
  options.backend = "cpu";
  tpdraft_drafter* drafter = NULL;
  check(tpdraft_open(argv[1], argv[2], &options, &drafter), "tpdraft_open");

  tpdraft_caps caps = {0};
  caps.struct_size = sizeof caps;
  check(tpdraft_caps_get(drafter, &caps), "tpdraft_caps_get");
  printf("tpdraft %s: %s, block %d, vocab %lld, %d tap layers of %lld, backend %s\n", tpdraft_version(),
         caps.architecture, caps.block_size, (long long)caps.vocab_size, caps.n_target_layers,
         (long long)caps.hidden_size, caps.backend);

  tpdraft_session session;
  check(tpdraft_session_open(drafter, &session), "tpdraft_session_open");

  const int drafts = caps.block_size - 1;
  const int64_t max_rows = 16;
  float* taps = malloc(sizeof(float) * (size_t)(max_rows * caps.taps_width));
  int64_t* tokens = malloc(sizeof(int64_t) * (size_t)drafts);
  float* q = malloc(sizeof(float) * (size_t)drafts);
  if (taps == NULL || tokens == NULL || q == NULL) return 1;
  uint64_t state = 88172645463325252ull;

  /* Step 1 settles the prompt's rows; each later step settles the rows the target committed: the
   * anchor and the drafts it accepted (here: a made-up count). The next anchor is the target's
   * token after them (here: the draft there). keep = -1: nothing settled was rejected. */
  int64_t n_new = 12, anchor = 1;
  for (int step = 1; step <= steps; ++step) {
    make_taps(taps, n_new * caps.taps_width, &state);
    tpdraft_step_entry entry;
    tpdraft_step_entry_init(&entry); /* keep and p0 -1, greedy, no distribution */
    entry.session = session;
    entry.n_new = n_new;
    entry.taps = taps;
    entry.anchor = anchor;
    entry.tokens = tokens;
    entry.q = q;
    check(tpdraft_step(drafter, &entry, 1), "tpdraft_step");

    int64_t length = 0;
    check(tpdraft_session_length(drafter, session, &length), "tpdraft_session_length");
    printf("step %d: length %lld anchor %lld tokens:", step, (long long)length, (long long)anchor);
    for (int i = 0; i < drafts; ++i) printf(" %lld", (long long)tokens[i]);
    printf("\n");

    const int accepted = step % drafts;
    n_new = 1 + accepted;
    anchor = tokens[accepted];
  }

  check(tpdraft_session_close(drafter, session), "tpdraft_session_close");
  tpdraft_close(drafter);
  free(taps);
  free(tokens);
  free(q);
  printf("done\n");
  return 0;
}
