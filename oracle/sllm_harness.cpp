// The oracle's driver of the kasahare 0.5.4 engine (simple-llm), compiled by oracle/sllm_oracle.py
// against the unpacked sdist in build/kasahare; never part of bankml_convert.
//
//   write-model CONFIG.txt WEIGHTS.f32 OUT.sllm    the engine's write_model_file for this Config and
//                                                  these float32 weights (its F32/Q4_0/FP16 writer)
//   write-tokenizer SPEC.bin OUT.tok.txt           the engine's Tokenizer::save for this vocabulary
//   quantize-q4_0 IN.f32 OUT.bin                   the engine's quantize_q4_0 of whole blocks
//   encode TOK.txt TEXT                            Tokenizer::load, then encode(text, add_bos=false)
//   decode MODEL.sllm TOK.txt N LOGITS.f32 ID...   Model::load, the prompt ids, then N greedy ids
//                                                  (argmax, first maximum; no stop at eos); writes
//                                                  the logits after the prompt and prints the ids
//
// The Tokenizer has no public way to be filled from a vocabulary; its members are opened here so
// that its own save() writes the file, rather than a writer of the oracle's.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#define private public
#include "simplellm/tokenizer.h"
#undef private
#include "simplellm/model.h"
#include "simplellm/model_data.h"

static std::vector<char> slurp(const char* path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) { std::fprintf(stderr, "cannot read %s\n", path); std::exit(2); }
    return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

static int write_model(const char* config_path, const char* weights_path, const char* out) {
    std::map<std::string, std::string> kv;
    std::ifstream f(config_path);
    std::string line;
    while (std::getline(f, line)) {
        auto eq = line.find('=');
        if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
    auto i = [&](const char* k) { return (int32_t)std::stol(kv.at(k)); };
    auto fl = [&](const char* k) { return std::strtof(kv.at(k).c_str(), nullptr); };
    sl::Config cfg;
    cfg.dtype = (sl::DType)i("dtype");
    cfg.vocab_size = i("vocab_size");
    cfg.bos_token_id = i("bos_token_id");
    cfg.eos_token_id = i("eos_token_id");
    cfg.dim = i("dim");
    cfg.n_layers = i("n_layers");
    cfg.n_heads = i("n_heads");
    cfg.n_kv_heads = i("n_kv_heads");
    cfg.head_dim = i("head_dim");
    cfg.hidden_dim = i("hidden_dim");
    cfg.max_seq_len = i("max_seq_len");
    cfg.rms_norm_eps = fl("rms_norm_eps");
    cfg.rope_freq_base = fl("rope_freq_base");
    cfg.tied_embeddings = i("tied_embeddings") != 0;
    std::vector<char> raw = slurp(weights_path);
    std::vector<float> w(raw.size() / 4);
    std::memcpy(w.data(), raw.data(), w.size() * 4);
    raw.clear(); raw.shrink_to_fit();
    return sl::write_model_file(out, cfg, w) ? 0 : 1;
}

static uint32_t u32(const std::vector<char>& b, std::size_t& pos) {
    uint32_t v;
    std::memcpy(&v, b.data() + pos, 4);
    pos += 4;
    return v;
}

// SPEC.bin: u32 n, n x (u32 length, bytes); u32 m, m x (u32 left id, u32 right id); i32 bos, i32 eos.
static int write_tokenizer(const char* spec, const char* out) {
    std::vector<char> b = slurp(spec);
    std::size_t pos = 0;
    sl::Tokenizer tk;
    uint32_t n = u32(b, pos);
    for (uint32_t id = 0; id < n; ++id) {
        uint32_t len = u32(b, pos);
        std::string payload(b.data() + pos, len);
        pos += len;
        tk.vocab_.push_back(payload);
        tk.tok_to_id_[payload] = (int32_t)id;
    }
    uint32_t m = u32(b, pos);
    for (uint32_t r = 0; r < m; ++r) {
        int32_t l = (int32_t)u32(b, pos), rr = (int32_t)u32(b, pos);
        tk.merges_.push_back({l, rr});
    }
    tk.bos_id_ = (int32_t)u32(b, pos);
    tk.eos_id_ = (int32_t)u32(b, pos);
    return tk.save(out) ? 0 : 1;
}

static int quantize(const char* in, const char* out) {
    std::vector<char> raw = slurp(in);
    std::vector<float> x(raw.size() / 4);
    std::memcpy(x.data(), raw.data(), x.size() * 4);
    std::vector<sl::BlockQ4_0> q(x.size() / 32);
    sl::quantize_q4_0(x.data(), q.data(), x.size());
    std::ofstream f(out, std::ios::binary);
    f.write((const char*)q.data(), q.size() * sizeof(sl::BlockQ4_0));
    return f ? 0 : 1;
}

static int encode(const char* tok_path, const char* text_path) {
    sl::Tokenizer tk;
    if (!tk.load(tok_path)) { std::fprintf(stderr, "Tokenizer::load failed\n"); return 1; }
    std::vector<char> text = slurp(text_path);
    std::vector<int32_t> ids = tk.encode(std::string(text.begin(), text.end()), false);
    for (std::size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
    return 0;
}

static int32_t argmax(const std::vector<float>& x) {
    int32_t best = 0;
    for (int32_t i = 1; i < (int32_t)x.size(); ++i) if (x[i] > x[best]) best = i;
    return best;
}

static int decode(int argc, char** argv) {
    auto m = sl::Model::load(argv[2], argv[3]);
    if (!m) { std::fprintf(stderr, "Model::load failed\n"); return 1; }
    int n_new = std::atoi(argv[4]);
    std::vector<int32_t> prompt;
    for (int a = 6; a < argc; ++a) prompt.push_back(std::atoi(argv[a]));
    std::vector<float> logits;
    for (std::size_t i = 0; i < prompt.size(); ++i) logits = m->forward(prompt[i], i == 0);
    std::ofstream lf(argv[5], std::ios::binary);
    lf.write((const char*)logits.data(), logits.size() * 4);
    for (int t = 0; t < n_new; ++t) {
        int32_t next = argmax(logits);
        std::printf(t ? " %d" : "%d", next);
        if (t + 1 < n_new) logits = m->forward(next, false);
    }
    std::printf("\n");
    return 0;
}

int main(int argc, char** argv) {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write-model" && argc == 5) return write_model(argv[2], argv[3], argv[4]);
    if (mode == "write-tokenizer" && argc == 4) return write_tokenizer(argv[2], argv[3]);
    if (mode == "quantize-q4_0" && argc == 4) return quantize(argv[2], argv[3]);
    if (mode == "encode" && argc == 4) return encode(argv[2], argv[3]);
    if (mode == "decode" && argc >= 7) return decode(argc, argv);
    std::fprintf(stderr, "usage: see the comment at the top of sllm_harness.cpp\n");
    return 2;
}
