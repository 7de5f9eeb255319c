#include "cli/prefix_cache_file.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>

#include "comm/together.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"

namespace shardlm {
namespace {

// FNV-1a 64: a digest to tell checkpoints apart, not a defence against a forged file.
struct Fnv {
    uint64_t h = 1469598103934665603ull;
    void add(const void* p, size_t n) {
        const unsigned char* b = static_cast<const unsigned char*>(p);
        for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    }
    void add(const std::string& s) { add(s.data(), s.size() + 1); }  // with its end, so "ab","c" != "a","bc"
};

// A tensor's name, dtype and shape, and 4 KB from the start, the middle and the end of its bytes:
// any two checkpoints with different weights differ there in practice, and it reads a few pages
// per tensor, not the gigabytes.
void add_tensor(Fnv& f, const std::string& name, const TensorInfo& t) {
    f.add(name);
    f.add(t.dtype_str);
    f.add(t.shape_str());
    constexpr size_t kSample = 4096;
    const size_t n = std::min(kSample, t.nbytes);
    f.add(t.data, n);
    f.add(t.data + (t.nbytes - n) / 2, n);
    f.add(t.data + t.nbytes - n, n);
}

std::string hex(const Fnv& f) {
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(f.h));
    return out;
}

std::string checkpoint_digest(const Session& s) {
    Fnv f;
    f.add(config_json(s.cfg));
    for (const auto& [name, t] : s.ckpt->tensors()) add_tensor(f, name, *t);
    return hex(f);
}

// Each --lora adapter: its folder, scale, and a digest of its config and factors as above.
std::string lora_digests(const std::vector<LoraAdapter>& adapters) {
    std::string out;
    for (const LoraAdapter& a : adapters) {
        Fnv f;
        f.add(read_text_file(a.dir + "/adapter_config.json"));
        const SafetensorsFile factors(a.dir + "/adapter_model.safetensors");
        for (const auto& [name, t] : factors.tensors()) add_tensor(f, name, t);
        out += (out.empty() ? "" : ", ") + a.dir + " x " + std::to_string(a.scale) + " " + hex(f);
    }
    return out;
}

// What every rank's tier would decide on: the tokens of its saves (none when it loads nothing).
std::string saved_tokens(bool ok, const std::vector<SavedPrefix>& saved) {
    if (!ok) return "none";
    std::string s = "some";
    for (const SavedPrefix& p : saved) {
        s.append(reinterpret_cast<const char*>(p.tokens.data()), p.tokens.size() * sizeof(int32_t));
        s += '\n';
    }
    return s;
}

}  // namespace

PrefixFileKey prefix_file_key(const Session& s, const SessionOptions& so, const Communicator& comm) {
    std::string device = s.engine->device();  // "cuda:1 NVIDIA H200": the name, not the index
    if (device.rfind("cuda:", 0) == 0 && device.find(' ') != std::string::npos) device = "cuda " + device.substr(device.find(' ') + 1);
    return {{"layout", "1"},  // Engine::save_kv's; bumped when it changes
            {"model", checkpoint_digest(s)},
            {"weights", weight_format_name(s.weights.format)},
            {"group_size", std::to_string(so.load.group_size)},
            {"keep_fp16", so.load.keep_fp16},
            {"lora", lora_digests(so.load.lora)},
            {"kv", kv_name(s.engine->options().kv)},
            {"device", device},
            {"rank", std::to_string(comm.rank())},
            {"ranks", std::to_string(comm.size())},
            {"position_bytes", std::to_string(s.engine->kv_position_bytes())}};
}

std::string describe_saves(const std::vector<SavedPrefix>& saved) {
    size_t positions = 0, bytes = 0;
    for (const SavedPrefix& p : saved) {
        positions += p.tokens.size();
        bytes += p.kv.size() + p.tokens.size() * sizeof(int32_t);
    }
    char mb[32];
    std::snprintf(mb, sizeof mb, "%.1f", double(bytes) / 1e6);
    return cat(saved.size(), saved.size() == 1 ? " prefix, " : " prefixes, ", positions, " positions (", mb, " MB)");
}

void check_prefix_cache_path(const std::string& path, const std::string& flag, int rank) {
    if (path.empty()) fail(flag, " needs a file name");
    const std::string mine = prefix_file_path(path, rank);
    const std::string why = unwritable_reason(mine);
    if (!why.empty()) fail(flag, ": cannot write ", mine, ": ", why);
}

PrefixCacheFile open_prefix_cache(Communicator& comm, const Session& s, const SessionOptions& so, const std::string& path,
                                  const std::string& flag) {
    PrefixCacheFile f;
    f.path = path;
    f.flag = flag;
    f.key = prefix_file_key(s, so, comm);
    std::vector<SavedPrefix>& saved = f.saved;
    std::string why;
    bool ok = false;
    run_together(comm, [&] { ok = read_prefix_file(prefix_file_path(path, comm.rank()), f.key, saved, why); });
    const int differs = first_differing_rank(comm, saved_tokens(ok, saved));
    if (comm.rank() == 0) {
        std::cerr << flag << " " << path << ": ";
        if (differs >= 0)
            std::cerr << "not used: rank " << differs << "'s file (" << prefix_file_path(path, differs)
                      << ") does not hold what rank 0's does (it is replaced at the end)\n";
        else if (ok)
            std::cerr << describe_saves(saved) << " loaded\n";
        else if (!why.empty())
            std::cerr << "not used: " << why << " (it is replaced at the end)\n";
        else
            std::cerr << "no file yet\n";
    }
    if (differs >= 0 || !ok) saved.clear();
    f.used = differs < 0 && ok;
    return f;
}

void save_prefix_cache(Communicator& comm, const PrefixCacheFile& f, const std::vector<SavedPrefix>& saved, bool changed) {
    if (!changed) {
        if (comm.rank() == 0) std::cerr << f.flag << " " << f.path << ": unchanged\n";
        return;
    }
    // Prefixes of a cache_salt or a LoRA adapter stay in memory: the file holds neither, and its
    // prefixes are shared with every request of the base model after a restart.
    // (A copy only where there are such prefixes to leave out.)
    auto base = [](const SavedPrefix& p) { return p.salt.empty() && p.adapter < 0; };
    const bool salted = !std::all_of(saved.begin(), saved.end(), base);
    std::vector<SavedPrefix> unsalted;
    for (size_t i = 0; salted && i < saved.size(); ++i)
        if (base(saved[i])) unsalted.push_back(saved[i]);
    const std::vector<SavedPrefix>& out = salted ? unsalted : saved;
    run_together(comm, [&] { write_prefix_file(prefix_file_path(f.path, comm.rank()), f.key, out); });
    if (comm.rank() == 0) std::cerr << f.flag << " " << f.path << ": " << describe_saves(out) << " saved\n";
}

}  // namespace shardlm
