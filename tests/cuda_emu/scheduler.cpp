// The emulator's SIMT core: grids of blocks of fibers, and the collectives between them.
//
// A block's threads are fibers on stacks of their own. The scheduler sweeps the block in thread
// order (or in reverse, SHARDLM_EMU_ORDER=reverse) and runs each runnable fiber until it exits or
// waits at a collective; so between two collectives every thread runs alone, all its instructions
// at once, and a missing barrier shows up as a read that comes before (or after) the write it
// needed, in one order or the other. After a sweep nobody can run: every collective whose
// participants have all arrived completes (values deposited at arrival, results computed for
// every lane before any lane continues), and the next sweep begins. In the reverse order a warp
// collective completes as soon as its last lane arrives and the warp runs on (warp_collective). When nothing can complete,
// the block is deadlocked (a barrier or a shuffle some thread never reaches) and the report names
// the kernel, the block and where each thread waits.
//
// Context switches are a dozen instructions of assembly (the callee-saved registers and the stack
// pointer), not swapcontext, which costs a system call each: a grid of 65535 blocks of 256 threads
// is 33 million switches. The FP control words (rounding, exceptions) are not switched: device
// code never changes them, so every fiber runs with the launching thread's.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define SHARDLM_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator's context switch is written for x86-64"
#endif

// shardlm_emu_switch(save, load): saves the callee-saved registers on the current stack, stores
// the stack pointer in *save, switches to the stack `load` and restores what was saved there.
// shardlm_emu_start: the first return address of a new fiber; calls r13(r12) and never returns.
asm(R"(
    .text
    .p2align 4
    .globl shardlm_emu_switch
    .hidden shardlm_emu_switch
    .type shardlm_emu_switch, @function
shardlm_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size shardlm_emu_switch, .-shardlm_emu_switch

    .p2align 4
    .globl shardlm_emu_start
    .hidden shardlm_emu_start
    .type shardlm_emu_start, @function
shardlm_emu_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size shardlm_emu_start, .-shardlm_emu_start
)");

extern "C" void shardlm_emu_switch(void** save, void* load);
extern "C" void shardlm_emu_start();

namespace shardlm_emu {

uint3 g_thread_idx{}, g_block_idx{};
dim3 g_block_dim, g_grid_dim;

namespace {

// Under ASan frames are larger (redzones, fake stacks for escaping locals).
#ifdef SHARDLM_EMU_ASAN
constexpr size_t kStackBytes = size_t(256) << 10;
#else
constexpr size_t kStackBytes = size_t(64) << 10;
#endif
constexpr int kMaxThreads = 1024;
constexpr size_t kMaxDynamicSmem = size_t(227) << 10;

size_t page_size() {
    static const size_t p = size_t(sysconf(_SC_PAGESIZE));
    return p;
}

// A fiber stack with an inaccessible page below it, so an overflow faults instead of writing over
// the neighbouring stack.
struct Stack {
    char* base = nullptr;  // the guard page
    char* lo = nullptr;    // usable [lo, lo + kStackBytes)
};

Stack new_stack() {
    const size_t guard = page_size();
    void* p = mmap(nullptr, guard + kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        std::fprintf(stderr, "shardlm CUDA emulator: cannot map a fiber stack\n");
        std::abort();
    }
    mprotect(p, guard, PROT_NONE);
    Stack s;
    s.base = static_cast<char*>(p);
    s.lo = s.base + guard;
    return s;
}

// In this order: the first two can run (next_runnable tests state <= Runnable).
enum class State : uint8_t { NotStarted, Runnable, Waiting, Exited };

struct Fiber {
    void* sp = nullptr;  // saved stack pointer while switched out
    int stack = -1;      // index into Scheduler::stacks, -1 when it holds none
    uint3 tid{};
    int index = 0;       // linear thread index in the block
    State state = State::NotStarted;
    // The collective it waits at, and what it brought and gets back.
    Op op = Op::None;
    unsigned mask = 0;
    int arg = 0, width = 32;
    uint64_t value = 0, result = 0;
    Site site{nullptr, 0};
};

const char* op_name(Op op) {
    switch (op) {
        case Op::SyncThreads: return "__syncthreads";
        case Op::SyncWarp: return "__syncwarp";
        case Op::ShflIdx: return "__shfl_sync";
        case Op::ShflUp: return "__shfl_up_sync";
        case Op::ShflDown: return "__shfl_down_sync";
        case Op::ShflXor: return "__shfl_xor_sync";
        case Op::Ballot: return "__ballot_sync";
        case Op::Any: return "__any_sync";
        case Op::All: return "__all_sync";
        case Op::MatchAny: return "__match_any_sync";
        case Op::Call: return "a warp-synchronous instruction (mma.sync)";
        default: return "(none)";
    }
}

const char* short_file(const char* f) {
    if (!f) return "?";
    const char* k = std::strstr(f, "kernels/");
    return k ? k : f;
}

// One grid in flight; everything here belongs to the one host thread that launched it.
struct Scheduler {
    std::vector<Stack> stacks;   // every stack ever mapped (reused by later blocks and launches)
    std::vector<int> free_stacks;
    std::vector<Fiber> fibers;
    Fiber* current = nullptr;
    void* sched_sp = nullptr;
    const std::function<void()>* body = nullptr;
    const char* kernel = nullptr;
    int threads = 0, live = 0;
    int exited_stack = -1;  // the stack of a fiber that has exited, freed by the next context
    // Per warp: lanes waiting at a warp collective, lanes exited (or past the block's end).
    unsigned warp_waiting[32] = {}, warp_gone[32] = {};
    int at_barrier = 0;     // threads waiting at __syncthreads
    Site barrier_site{nullptr, 0};
    bool reverse = false;
    // Dynamic shared memory: the launch's bytes end where an inaccessible page begins.
    char* smem_region = nullptr;  // kMaxDynamicSmem (page-rounded) + a guard page
    char* smem = nullptr;
    size_t smem_bytes = 0;
#ifdef SHARDLM_EMU_ASAN
    const void* sched_stack_bottom = nullptr;  // the launching thread's stack
    size_t sched_stack_size = 0;
    bool from_scheduler = false;
#endif

    int take_stack() {
        if (free_stacks.empty()) {
            stacks.push_back(new_stack());
            return int(stacks.size()) - 1;
        }
        const int s = free_stacks.back();
        free_stacks.pop_back();
        return s;
    }
};

Scheduler g;

[[noreturn]] void fiber_main(Fiber* f);

// Gives a fiber that has not run yet a stack whose first switch lands in fiber_main(f).
void start_fiber(Fiber& f) {
    f.stack = g.take_stack();
    const Stack& st = g.stacks[size_t(f.stack)];
#ifdef SHARDLM_EMU_ASAN
    // A reused stack still carries the poison of the frames its last fiber abandoned.
    __asan_unpoison_memory_region(st.lo, kStackBytes);
#endif
    // Stacks are a whole number of pages apart, so their tops would all fall into the same L1
    // cache set: start each one a different 64 bytes into its last page.
    char* top = st.lo + kStackBytes - size_t(f.stack % 64) * 64;
    // The frame shardlm_emu_switch pops: r15, r14, r13, r12, rbx, rbp and the return address;
    // seven words below a 16-byte aligned top, so the stack is aligned at shardlm_emu_start's call.
    uint64_t* sp = reinterpret_cast<uint64_t*>(top) - 7;
    sp[0] = sp[1] = 0;                                // r15, r14
    sp[2] = reinterpret_cast<uint64_t>(&fiber_main);  // r13: what shardlm_emu_start calls
    sp[3] = reinterpret_cast<uint64_t>(&f);           // r12: its argument
    sp[4] = sp[5] = 0;                                // rbx, rbp
    sp[6] = reinterpret_cast<uint64_t>(&shardlm_emu_start);
    f.sp = sp;
    f.state = State::Runnable;
}

// The next fiber of the sweep after thread `after` (in the sweep's direction) that can run.
Fiber* next_runnable(int after) {
    if (g.reverse) {
        for (int i = after - 1; i >= 0; --i)
            if (g.fibers[size_t(i)].state <= State::Runnable) return &g.fibers[size_t(i)];
    } else {
        for (int i = after + 1; i < g.threads; ++i)
            if (g.fibers[size_t(i)].state <= State::Runnable) return &g.fibers[size_t(i)];
    }
    return nullptr;
}

// What every context does first after a switch lands in it: free the stack of a fiber that
// exited on the way (it could not free the stack it was running on), tell ASan where it is.
void landed(void* fake_stack) {
#ifdef SHARDLM_EMU_ASAN
    const void* bottom = nullptr;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(fake_stack, &bottom, &size);
    if (g.from_scheduler) {
        g.sched_stack_bottom = bottom;
        g.sched_stack_size = size;
    }
#endif
    (void)fake_stack;
    if (g.exited_stack >= 0) {
        g.free_stacks.push_back(g.exited_stack);
        g.exited_stack = -1;
    }
}

// From the running context (fiber `from`, or the scheduler when null) to fiber `to` (or the
// scheduler when null). Fibers hand over to the next fiber of the sweep directly, one switch per
// wait instead of two through the scheduler; the scheduler runs again when a sweep is over.
// Returns when something switches back to `from`.
void switch_context(Fiber* from, Fiber* to) {
    void** save = from ? &from->sp : &g.sched_sp;
    void* load = g.sched_sp;
    if (to) {
        if (to->state == State::NotStarted) start_fiber(*to);
        load = to->sp;
        g_thread_idx = to->tid;
    }
    g.current = to;
    void* fake = nullptr;
#ifdef SHARDLM_EMU_ASAN
    const bool exiting = from && from->state == State::Exited;
    if (to) __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, g.stacks[size_t(to->stack)].lo, kStackBytes);
    else __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, g.sched_stack_bottom, g.sched_stack_size);
    g.from_scheduler = from == nullptr;
#endif
    shardlm_emu_switch(save, load);
    landed(fake);
}

// A fiber stops (waiting at a collective): the sweep goes on with the next one.
void yield(Fiber& f) { switch_context(&f, next_runnable(f.index)); }

void fiber_main(Fiber* f) {
    landed(nullptr);
    try {
        (*g.body)();
    } catch (const std::exception& e) {
        device_fault("C++ exception escaped the kernel: %s", e.what());
    } catch (...) {
        device_fault("C++ exception escaped the kernel");
    }
    f->state = State::Exited;
    --g.live;
    g.warp_gone[size_t(f->index >> 5)] |= 1u << (f->index & 31);
    g.exited_stack = f->stack;
    f->stack = -1;
    switch_context(f, next_runnable(f->index));
    std::abort();  // an exited fiber is never resumed
}

Fiber& self(const char* what) {
    if (!g.current) {
        std::fprintf(stderr, "shardlm CUDA emulator: %s called outside a kernel\n", what);
        std::abort();
    }
    return *g.current;
}

std::string describe_wait(const Fiber& f) {
    char b[256];
    if (f.state == State::Exited) return "exited";
    if (f.op == Op::SyncThreads)
        std::snprintf(b, sizeof b, "%s at %s:%d", op_name(f.op), short_file(f.site.file), f.site.line);
    else
        std::snprintf(b, sizeof b, "%s(mask 0x%08x) at %s:%d", op_name(f.op), f.mask, short_file(f.site.file),
                      f.site.line);
    return b;
}

// Where every thread of the block is: runs of consecutive threads in the same place.
std::string block_state() {
    std::string out;
    int i = 0;
    while (i < g.threads) {
        const std::string what = describe_wait(g.fibers[size_t(i)]);
        int j = i + 1;
        while (j < g.threads && describe_wait(g.fibers[size_t(j)]) == what) ++j;
        char b[64];
        if (j - i == 1) std::snprintf(b, sizeof b, "    thread %d: ", i);
        else std::snprintf(b, sizeof b, "    threads %d-%d: ", i, j - 1);
        out += b + what + "\n";
        i = j;
    }
    return out;
}

[[noreturn]] void block_fault(const std::string& what) {
    std::fprintf(stderr,
                 "shardlm CUDA emulator: kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), %u threads: %s\n"
                 "  where the threads are:\n%s",
                 g.kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z, g_grid_dim.x, g_grid_dim.y, g_grid_dim.z,
                 g.threads, what.c_str(), block_state().c_str());
    std::fflush(stderr);
    std::abort();
}

// The lane whose value lane `lane` reads (CUDA's shuffle rules for sub-warps of `width` lanes);
// the lane itself when the source is past its sub-warp.
int shuffle_source(Op op, int lane, int arg, int width) {
    const int base = lane & ~(width - 1);
    switch (op) {
        case Op::ShflIdx: return base + (arg & (width - 1));
        case Op::ShflUp: return lane - arg >= base ? lane - arg : lane;
        case Op::ShflDown: return lane + arg < base + width ? lane + arg : lane;
        case Op::ShflXor: {
            const int src = lane ^ arg;
            return src < base + width ? src : lane;  // later sub-warps give back the own value
        }
        default: return lane;
    }
}

WarpCall* first_call(WarpCall* const* calls) {
    for (int l = 0; l < 32; ++l)
        if (calls[l]) return calls[l];
    return nullptr;
}

// Completes the collective of the lanes `mask` of warp `w` (all waiting at it).
void complete_warp_group(int w, unsigned mask) {
    Fiber* lanes = &g.fibers[size_t(w) * 32];
    const Fiber& first = lanes[__builtin_ctz(mask)];
    const Op op = first.op;
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l)
        if ((mask >> l) & 1u && lanes[l].value) ballot |= 1u << l;
    if (op == Op::Call) {
        WarpCall* calls[32] = {};
        for (int l = 0; l < 32; ++l)
            if ((mask >> l) & 1u) calls[l] = reinterpret_cast<WarpCall*>(uintptr_t(lanes[l].value));
        for (int l = 0; l < 32; ++l)
            if (calls[l] && calls[l]->fn != first_call(calls)->fn) {
                char b[200];
                std::snprintf(b, sizeof b, "%s at %s:%d: lane %d runs a different instruction than lane %d",
                              op_name(op), short_file(lanes[l].site.file), lanes[l].site.line, l,
                              __builtin_ctz(mask));
                block_fault(b);
            }
        first_call(calls)->fn(calls);
    }
    for (int l = 0; l < 32; ++l) {
        if (!((mask >> l) & 1u)) continue;
        Fiber& f = lanes[l];
        switch (op) {
            case Op::SyncWarp:
            case Op::Call: break;
            case Op::Ballot: f.result = ballot; break;
            case Op::Any: f.result = ballot != 0; break;
            case Op::All: f.result = ballot == mask; break;
            case Op::MatchAny: {
                unsigned m = 0;
                for (int j = 0; j < 32; ++j)
                    if ((mask >> j) & 1u && lanes[j].value == f.value) m |= 1u << j;
                f.result = m;
                break;
            }
            default: {
                const int src = shuffle_source(op, l, f.arg, f.width);
                if (!((mask >> src) & 1u)) {
                    char b[200];
                    std::snprintf(b, sizeof b, "%s at %s:%d: lane %d reads lane %d, which is not in the mask 0x%08x",
                                  op_name(op), short_file(f.site.file), f.site.line, l, src, mask);
                    block_fault(b);
                }
                f.result = lanes[src].value;
                break;
            }
        }
    }
    for (int l = 0; l < 32; ++l)
        if ((mask >> l) & 1u) {
            lanes[l].state = State::Runnable;
            lanes[l].op = Op::None;
        }
    g.warp_waiting[size_t(w)] &= ~mask;
}

// The warp collective lane l of warp w waits at: completed (true) when every lane of its mask has
// arrived at it; a mask naming exited lanes, or lanes meeting at different collectives, is a
// fault. False (nothing done) while lanes of the mask are still on their way.
bool try_complete(int w, int l) {
    const unsigned waiting = g.warp_waiting[size_t(w)], gone = g.warp_gone[size_t(w)];
    Fiber* lanes = &g.fibers[size_t(w) * 32];
    const Fiber& f = lanes[l];
    const unsigned m = f.mask;
    char b[300];
    if (m & gone) {
        std::snprintf(b, sizeof b,
                      "%s(mask 0x%08x) at %s:%d by lane %d: lanes 0x%08x of the mask have exited (or do not "
                      "exist) and never arrive",
                      op_name(f.op), m, short_file(f.site.file), f.site.line, l, m & gone);
        block_fault(b);
    }
    bool complete = (m & ~waiting) == 0;
    for (unsigned r = m; r && complete; r &= r - 1) complete = lanes[__builtin_ctz(r)].mask == m;
    if (!complete) return false;
    for (unsigned r = m; r; r &= r - 1) {
        const int j = __builtin_ctz(r);
        const Fiber& o = lanes[j];
        if (o.op != f.op || o.width != f.width || (f.op == Op::MatchAny && o.arg != f.arg)) {
            std::snprintf(b, sizeof b,
                          "lanes of mask 0x%08x meet at different warp collectives: lane %d at %s (width %d) "
                          "%s:%d, lane %d at %s (width %d) %s:%d",
                          m, l, op_name(f.op), f.width, short_file(f.site.file), f.site.line, j, op_name(o.op),
                          o.width, short_file(o.site.file), o.site.line);
            block_fault(b);
        }
    }
    complete_warp_group(w, m);
    return true;
}

// After a sweep (no fiber runnable): completes every collective whose participants have all
// arrived. False when none could.
bool resolve() {
    bool progressed = false;
    const int warps = (g.threads + 31) / 32;
    for (int w = 0; w < warps; ++w) {
        for (unsigned todo = g.warp_waiting[size_t(w)]; todo;) {
            const int l = __builtin_ctz(todo);
            const unsigned m = g.fibers[size_t(w) * 32 + size_t(l)].mask;
            const bool done = try_complete(w, l);
            todo &= done ? ~m : ~(1u << l);
            progressed |= done;
        }
    }
    // __syncthreads: every thread that has not exited is there. A GPU of sm_70 or later lets a
    // barrier complete without the threads that exited, but CUDA calls a barrier that not every
    // thread of the block reaches undefined (and the kernels here return whole blocks, before any
    // barrier, on purpose): report it.
    if (g.at_barrier > 0 && g.at_barrier == g.live && g.live < g.threads)
        block_fault("__syncthreads reached after other threads of the block exited (a barrier must be reached by "
                    "the whole block)");
    if (g.at_barrier > 0 && g.at_barrier == g.live) {
        for (int i = 0; i < g.threads; ++i) {
            Fiber& f = g.fibers[size_t(i)];
            if (f.state == State::Waiting) {
                f.state = State::Runnable;
                f.op = Op::None;
            }
        }
        g.at_barrier = 0;
        progressed = true;
    }
    return progressed;
}

void run_block(uint3 block) {
    g_block_idx = block;
    for (int i = 0; i < g.threads; ++i) {
        Fiber& f = g.fibers[size_t(i)];
        f = Fiber{};
        f.index = i;
        f.tid = uint3{unsigned(i) % g_block_dim.x, (unsigned(i) / g_block_dim.x) % g_block_dim.y,
                      unsigned(i) / (g_block_dim.x * g_block_dim.y)};
    }
    g.live = g.threads;
    g.at_barrier = 0;
    for (int w = 0; w < 32; ++w) {
        const int n = std::max(0, std::min(32, g.threads - 32 * w));  // lanes of warp w in the block
        g.warp_waiting[w] = 0;
        g.warp_gone[w] = n == 32 ? 0u : ~0u << n;
    }
    // Uninitialised shared memory reads as NaN (all bits set), not as the last block's values.
    if (g.smem_bytes) std::memset(g.smem, 0xff, g.smem_bytes);
    for (;;) {
        // One sweep: the fibers hand over to each other until the last runnable one comes back here.
        if (Fiber* first = next_runnable(g.reverse ? g.threads : -1)) switch_context(nullptr, first);
        if (g.live == 0) return;
        if (!resolve()) block_fault("deadlock: no collective can complete (a thread never reaches a barrier or "
                                    "shuffle that others wait at)");
    }
}

bool read_reverse() {
    const char* v = std::getenv("SHARDLM_EMU_ORDER");
    if (!v || !*v || std::strcmp(v, "forward") == 0) return false;
    if (std::strcmp(v, "reverse") == 0) return true;
    std::fprintf(stderr, "shardlm CUDA emulator: SHARDLM_EMU_ORDER=%s (forward or reverse)\n", v);
    std::abort();
}

// A fault handler naming the kernel and thread: a wild device access, a fiber's stack overflow
// or a dynamic shared memory overrun (each ends at an inaccessible page) lands here.
void on_fault(int sig, siginfo_t* info, void*) {
    char b[512];
    int n;
    if (g.kernel)
        n = std::snprintf(b, sizeof b,
                          "shardlm CUDA emulator: %s at address %p in kernel %s, block (%u,%u,%u), thread (%u,%u,%u)%s\n",
                          sig == SIGSEGV ? "segmentation fault" : "bus error", info->si_addr, g.kernel, g_block_idx.x,
                          g_block_idx.y, g_block_idx.z, g.current ? g.current->tid.x : 0,
                          g.current ? g.current->tid.y : 0, g.current ? g.current->tid.z : 0,
                          g.smem && static_cast<char*>(info->si_addr) >= g.smem + g.smem_bytes &&
                                  static_cast<char*>(info->si_addr) < g.smem + g.smem_bytes + page_size() + 16
                              ? " (past the end of the launch's dynamic shared memory)"
                              : "");
    else
        n = std::snprintf(b, sizeof b, "shardlm CUDA emulator: %s at address %p (host code)\n",
                          sig == SIGSEGV ? "segmentation fault" : "bus error", info->si_addr);
    if (n > 0) (void)!write(2, b, size_t(std::min(n, int(sizeof b) - 1)));
    signal(sig, SIG_DFL);
    raise(sig);
}

void install_fault_handler() {
#ifndef SHARDLM_EMU_ASAN  // ASan reports faults itself, with a stack trace
    static char altstack[64 << 10];
    stack_t ss{};
    ss.ss_sp = altstack;
    ss.ss_size = sizeof altstack;
    sigaltstack(&ss, nullptr);
    struct sigaction sa{};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
#endif
}

}  // namespace

uint64_t warp_collective(Op op, unsigned mask, uint64_t value, int arg, int width, Site site) {
    Fiber& f = self(op_name(op));
    const int lane = f.index & 31;
    if (!((mask >> lane) & 1u))
        device_fault("%s(mask 0x%08x) at %s:%d: the calling lane %d is not in the mask", op_name(op), mask,
                     short_file(site.file), site.line, lane);
    if (width < 1 || width > 32 || (width & (width - 1)) != 0)
        device_fault("%s at %s:%d: width %d is not a power of two up to 32", op_name(op), short_file(site.file),
                     site.line, width);
    f.op = op;
    f.mask = mask;
    f.value = value;
    f.arg = arg;
    f.width = width;
    f.site = site;
    f.state = State::Waiting;
    const int w = f.index >> 5;
    g.warp_waiting[size_t(w)] |= 1u << lane;
    // Reverse order is also warp-major: the last lane to arrive completes the collective at once
    // and the warp's lanes run on (from the first in the sweep's order) to their next block-wide
    // wait before the sweep moves to the next warp. A warp thus runs ahead of the warps below it
    // through any number of shuffles, which is what exposes a missing __syncthreads between two
    // uses of shared memory that only shuffles separate (the forward order, where every
    // collective ends a sweep, moves the warps in lockstep).
    if (g.reverse && try_complete(w, lane)) {
        Fiber* lead = &g.fibers[size_t(w) * 32 + size_t(31 - __builtin_clz(mask))];
        if (lead != &f) switch_context(&f, lead);  // f is Runnable: the sweep comes back to it
        return f.result;
    }
    yield(f);
    return f.result;
}

void warp_call(WarpCall* mine, unsigned mask, Site site) {
    warp_collective(Op::Call, mask, uint64_t(reinterpret_cast<uintptr_t>(mine)), 0, 32, site);
}

void sync_threads(Site site) {
    Fiber& f = self("__syncthreads");
    f.op = Op::SyncThreads;
    f.site = site;
    f.state = State::Waiting;
    // Every thread must wait at the same __syncthreads (it is undefined otherwise).
    if (g.at_barrier++ == 0) {
        g.barrier_site = site;
    } else if (site.line != g.barrier_site.line || std::strcmp(site.file, g.barrier_site.file) != 0) {
        char b[300];
        std::snprintf(b, sizeof b, "threads wait at different __syncthreads: %s:%d and %s:%d",
                      short_file(g.barrier_site.file), g.barrier_site.line, short_file(site.file), site.line);
        block_fault(b);
    }
    yield(f);
}

void* dynamic_smem() {
    self("dynamic shared memory");
    return g.smem;
}

void device_fault(const char* fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (g.current)
        std::fprintf(stderr, "shardlm CUDA emulator: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): %s\n", g.kernel,
                     g_block_idx.x, g_block_idx.y, g_block_idx.z, g.current->tid.x, g.current->tid.y,
                     g.current->tid.z, what);
    else
        std::fprintf(stderr, "shardlm CUDA emulator: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

bool reverse_order() {
    static const bool r = read_reverse();
    return r;
}

void run_grid(const char* name, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
    if (g.kernel) {
        std::fprintf(stderr, "shardlm CUDA emulator: kernel %s launched while %s runs (from a kernel, or from two host "
                     "threads at once)\n", name, g.kernel);
        std::abort();
    }
    static bool once = [] {
        install_fault_handler();
        return true;
    }();
    (void)once;
    // Dynamic shared memory: the launch's bytes end where an inaccessible page begins.
    const size_t region = (kMaxDynamicSmem + page_size() - 1) / page_size() * page_size();
    if (!g.smem_region) {
        void* p = mmap(nullptr, region + page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            std::fprintf(stderr, "shardlm CUDA emulator: cannot map shared memory\n");
            std::abort();
        }
        g.smem_region = static_cast<char*>(p);
        mprotect(g.smem_region + region, page_size(), PROT_NONE);
    }
    g.smem = g.smem_region + region - ((smem + 15) & ~size_t(15));  // 16-byte aligned, like extern __shared__ float4
    g.smem_bytes = smem;
    g.kernel = name;
    g.body = &body;
    g.reverse = reverse_order();
    g_grid_dim = grid;
    g_block_dim = block;
    g.threads = int(block.x * block.y * block.z);
    if (g.fibers.size() < size_t(kMaxThreads)) g.fibers.resize(size_t(kMaxThreads));
    const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
    for (uint64_t k = 0; k < blocks; ++k) {
        const uint64_t b = g.reverse ? blocks - 1 - k : k;
        run_block(uint3{unsigned(b % grid.x), unsigned((b / grid.x) % grid.y), unsigned(b / (uint64_t(grid.x) * grid.y))});
    }
    g.kernel = nullptr;
    g.body = nullptr;
}

}  // namespace shardlm_emu

// The built-in variables device code reads (declared by cuda_emu.h).
extern const uint3& threadIdx;
extern const uint3& blockIdx;
extern const dim3& blockDim;
extern const dim3& gridDim;
const uint3& threadIdx = shardlm_emu::g_thread_idx;
const uint3& blockIdx = shardlm_emu::g_block_idx;
const dim3& blockDim = shardlm_emu::g_block_dim;
const dim3& gridDim = shardlm_emu::g_grid_dim;
