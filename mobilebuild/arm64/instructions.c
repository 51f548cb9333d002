/*
 * A QEMU TCG plugin that counts the guest instructions a process executes, and reports the running total each time
 * the guest marks a point: a close() of the descriptor MARK (negative, so nothing real is ever closed). The guest
 * (mobilebuild/worker/guest/serve.py) marks before and after each inference; the differences are instructions per
 * inference, the same whatever the host's load.
 *
 * Declared here rather than taken from QEMU's qemu-plugin.h, which Debian ships only in its source package: the few
 * entry points of plugin API version 1 (QEMU 4.2 to 8.x) that this file uses, with their documented signatures.
 *
 * Built by `mobilebuild arm64 setup`: cc -shared -fPIC -O2 -o instructions.so instructions.c
 * Loaded with: qemu-aarch64 -plugin instructions.so,out=FILE ...  (one line per mark: the total so far)
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
typedef struct {
    const char *target_name;
    struct { int min; int cur; } version;
    _Bool system_emulation;
} qemu_info_t;
struct qemu_plugin_tb;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS };

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, struct qemu_plugin_tb *));
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *, void (*)(unsigned int, void *),
                                          enum qemu_plugin_cb_flags, void *);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, unsigned int, int64_t,
                                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                                          uint64_t));

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

#define AARCH64_CLOSE 57
#define MARK (-19778)  /* what the guest closes to mark a point */

static uint64_t executed;  /* every guest thread's instructions, added atomically: threads run in parallel */
static FILE *out;

static void on_block(unsigned int vcpu, void *instructions)
{
    __atomic_fetch_add(&executed, (uint64_t)(uintptr_t)instructions, __ATOMIC_RELAXED);
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    qemu_plugin_register_vcpu_tb_exec_cb(tb, on_block, QEMU_PLUGIN_CB_NO_REGS,
                                         (void *)(uintptr_t)qemu_plugin_tb_n_insns(tb));
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t number, uint64_t a1, uint64_t a2,
                       uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    if (number == AARCH64_CLOSE && (int32_t)a1 == MARK) {
        fprintf(out, "%" PRIu64 "\n", __atomic_load_n(&executed, __ATOMIC_RELAXED));
        fflush(out);
    }
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                                               int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            path = argv[i] + 4;
        }
    }
    if (path == NULL || (out = fopen(path, "a")) == NULL) {
        fprintf(stderr, "instructions plugin: give out=FILE, a file it can append to\n");
        return 1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    return 0;
}
