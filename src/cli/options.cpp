#include "cli/options.h"

#include <sys/resource.h>

#include <iostream>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"

namespace shardlm {

bool parse_args(const std::vector<std::string>& args, const po::options_description& desc,
                po::variables_map& vm, const std::string& usage, bool print) {
    try {
        po::store(po::command_line_parser(args).options(desc).run(), vm);
        if (vm.count("help")) {
            if (print) std::cout << usage << "\n\n" << desc << "\n";
            return false;
        }
        po::notify(vm);
    } catch (const po::error& e) {
        fail(e.what());
    }
    return true;
}

std::vector<std::vector<int32_t>> parse_prompt_ids(const std::string& s) {
    std::vector<std::vector<int32_t>> out(1);
    size_t i = 0;
    while (i <= s.size()) {
        if (i == s.size() || s[i] == ';') {
            if (out.back().empty()) fail("--prompt-ids: prompt ", out.size() - 1, " is empty");
            if (i == s.size()) break;
            out.emplace_back();
            ++i;
            continue;
        }
        if (s[i] == ',' || s[i] == ' ') { ++i; continue; }
        size_t j = i;
        while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
        if (j == i || j - i > 9) fail("--prompt-ids: expected a token id at \"", s.substr(i, 12), "\"");
        out.back().push_back(int32_t(std::stol(s.substr(i, j - i))));
        i = j;
    }
    return out;
}

void set_threads(int threads) {
    if (threads < 0) fail("--threads must be >= 0");
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
#endif
}

size_t peak_rss_bytes() {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return size_t(ru.ru_maxrss) * 1024;  // Linux reports kilobytes
}

}  // namespace shardlm
