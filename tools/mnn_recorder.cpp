// Records what MNN's own LLM runtime computes for one prompt: the logits of the prefill and of every
// greedy decode step after it, as JSON on stdout. Built by tools/build_mnn.py against the MNN it builds
// (the newer export format's reference), one process and one fresh Llm per prompt.
//
//     mnn_recorder CONFIG_JSON OVERRIDES_JSON STEPS TOP_K ID [ID ...]
//
// OVERRIDES_JSON goes to set_config before load ("{}" for none). Each line printed is one forward:
// {"step": 0, "input": [ids fed], "top_ids": [...], "top_logits": [...], "argmax": id, "std": s}
// where step 0 is the prefill of the given ids and step k feeds the argmax of step k - 1. With
// {"all_logits": true} in OVERRIDES_JSON the prefill's every row comes first, a line each:
// {"prefill_row": r, "top_ids": [...], "top_logits": [...], "argmax": id, "std": s}.
#include <llm/llm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

using MNN::Transformer::Llm;

// The top_k (id, logit) pairs of one row of logits, and the row's standard deviation.
static void print_top(const float* logits, int vocab, int top_k) {
    std::vector<int> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    top_k = std::min(top_k, vocab);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    double mean = 0, square = 0;
    for (int i = 0; i < vocab; ++i) mean += logits[i];
    mean /= vocab;
    for (int i = 0; i < vocab; ++i) square += (logits[i] - mean) * (logits[i] - mean);
    std::printf("\"top_ids\": [");
    for (int i = 0; i < top_k; ++i) std::printf("%s%d", i ? ", " : "", order[i]);
    std::printf("], \"top_logits\": [");
    for (int i = 0; i < top_k; ++i) std::printf("%s%.9g", i ? ", " : "", logits[order[i]]);
    std::printf("], \"argmax\": %d, \"std\": %.9g}\n", order[0], std::sqrt(square / vocab));
}

static void print_step(int step, const std::vector<int>& fed, const float* logits, int vocab, int top_k) {
    std::printf("{\"step\": %d, \"input\": [", step);
    for (size_t i = 0; i < fed.size(); ++i) std::printf("%s%d", i ? ", " : "", fed[i]);
    std::printf("], ");
    print_top(logits, vocab, top_k);
}

int main(int argc, char** argv) {
    if (argc < 6) {
        std::fprintf(stderr, "usage: %s CONFIG_JSON OVERRIDES_JSON STEPS TOP_K ID [ID ...]\n", argv[0]);
        return 2;
    }
    std::unique_ptr<Llm> llm(Llm::createLLM(argv[1]));
    if (!llm || !llm->set_config(argv[2]) || !llm->load()) {
        std::fprintf(stderr, "MNN could not load %s\n", argv[1]);
        return 1;
    }
    const int steps = std::atoi(argv[3]), top_k = std::atoi(argv[4]);
    std::vector<int> fed;
    for (int i = 5; i < argc; ++i) fed.push_back(std::atoi(argv[i]));
    for (int step = 0; step <= steps; ++step) {
        auto logits = llm->forward(fed, step == 0);
        if (logits == nullptr) {
            std::fprintf(stderr, "MNN's forward failed at step %d\n", step);
            return 1;
        }
        const int vocab = logits->getInfo()->dim.back();
        const int rows = logits->getInfo()->size / vocab;   // all of the prefill's with all_logits set
        const float* first = logits->readMap<float>();
        for (int r = 0; rows > 1 && r < rows; ++r) {
            std::printf("{\"prefill_row\": %d, ", r);
            print_top(first + (size_t)r * vocab, vocab, top_k);
        }
        const float* row = first + (size_t)(rows - 1) * vocab;
        print_step(step, fed, row, vocab, top_k);
        fed = {static_cast<int>(std::max_element(row, row + vocab) - row)};
    }
    std::fflush(stdout);
    std::_Exit(0);   // MNN's destructors have crashed at exit (its embedding models): skip them
}
