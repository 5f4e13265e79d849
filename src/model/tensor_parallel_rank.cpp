// TensorParallel's step on one rank (model/tensor_parallel.h): the forward pass over the
// rank's shards, with the collectives of Megatron's column/row-parallel split.
#include "core/check.h"
#include "model/tensor_parallel_rank.h"

namespace sala {

void TensorParallel::run_rank(Rank& k, const Job& job, ForwardTrace* trace, int32_t* argmax) {
  Backend& be = *k.be;
  const int64_t T = k.meta.num_tokens();
  be.begin_step(k.meta);
  if (job.graph_key == 0) {
    rank_layers(k, T, job.R, trace, job.extra, *job.logits);
  } else if (!be.graph_launch(job.graph_key)) {
    // Every rank sees the same steps, so all record a key at the same step (or all run it
    // directly); the collectives (NCCL's, the peer group's) are captured on its stream.
    const bool recording = be.graph_capture_begin(job.graph_key);
    rank_layers(k, T, job.graph_rows, nullptr, nullptr, *job.logits);
    if (recording) be.graph_capture_end(job.graph_key);
  }
  if (job.R == 0) return;
  // The first R rows' vocab shards: the distributed argmax (rank 0's host ids), or gathered into
  // rank 0's logits. Not part of a recording (the argmax ends on the host).
  const Tensor part{k.logits_part.data, DType::F32, job.R, k.vocab1 - k.vocab0};
  // Every rank knows whether rank 0 wants the argmax only: forward() sets the same flag.
  if (want_argmax_) {
    k.comm->argmax_rows(part, k.vocab0, argmax, 0);
  } else {
    Tensor out{job.logits->data, DType::F32, job.R, cfg_.vocab_size};
    k.comm->gather_cols(part, out, 0);
  }
}

void TensorParallel::rank_layers(Rank& k, int64_t T, int64_t R, ForwardTrace* trace,
                                 RowLogprobs* extra, Tensor& logits) {
  Backend& be = *k.be;
  Communicator& comm = *k.comm;
  const ModelConfig& c = cfg_;
  const ModelWeights& w = *k.w;
  const int n = size();
  const float eps = float(c.rms_norm_eps), alpha = c.residual_scale();
  const int64_t qd = int64_t(c.num_attention_heads) * c.head_dim;
  const int64_t kvd = int64_t(c.num_key_value_heads) * c.head_dim;
  const int64_t ld = int64_t(c.lightning_nh) * c.lightning_head_dim;
  auto rows = [T](const Tensor& t, int64_t cols) { return Tensor{t.data, t.dtype, T, cols}; };
  auto trace_rows = [&](const Tensor& t) {
    if (!trace) return;
    std::vector<float> v(size_t(t.numel()));
    be.download_f32(t, v.data());
    trace->hidden.push_back(std::move(v));
  };
  Tensor h = rows(k.h, c.hidden_size), x = rows(k.x, c.hidden_size), mix = rows(k.mix, c.hidden_size);
  Tensor g = rows(k.g, c.intermediate_size / n), u = rows(k.u, c.intermediate_size / n);

  be.embedding(w.embed_tokens, float(c.scale_emb), h);
  trace_rows(h);
  be.rmsnorm(h, w.layers[0].input_layernorm, eps, x);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& l = w.layers[size_t(i)];  // the rank's shard
    const int ki = c.kind_index(i);
    const bool sparse = l.type == MixerType::Sparse;
    const int64_t od = sparse ? qd : ld;  // the mixer's output width (all heads)
    const int split = sparse && !sparse_split_ ? 1 : n;  // 1: a replicated sparse mixer
    Tensor q = rows(k.q, od / split), kk = rows(k.k, (sparse ? kvd : ld) / split);
    Tensor v = rows(k.v, (sparse ? kvd : ld) / split), gate = rows(k.gate, od / split);
    // a: the rank's heads' columns [T, od/n], o_proj's row-parallel input.
    Tensor a = rows(k.attn, od / n), a_full = rows(k.attn_full, od);
    be.linear_multi(x, l.qkvg, {&q, &kk, &v, &gate});
    if (sparse) {
      // NoPE; then attention * sigmoid(o_gate(x)). Split: the rank's KV heads and their query
      // heads, straight into a. Replicated: all heads on every rank, then the rank's columns.
      if (split == 1) {
        be.sparse_attention_mul_sigmoid(ki, q, kk, v, gate, a_full);
        be.copy_cols(a_full, k.r * (od / n), a);
      } else {
        be.sparse_attention_mul_sigmoid(ki, q, kk, v, gate, a);
      }
    } else {
      // The rank's heads with their GLOBAL slopes (k.slopes), then the o_norm over all nh*d
      // columns (not the shard's: SGLang's TP bug).
      be.lightning_qk_attention(ki, q, kk, v, l.q_norm, l.k_norm, eps, c.lightning_head_dim,
                                c.rope_theta, k.slopes, float(c.lightning_scale), a);
      if (limits_.tp_gather_o_norm) {
        // The heads and the z gate all-gathered, the whole row normed (TP=1's numbers), the
        // rank's columns taken back for o_proj.
        Tensor z_full = rows(k.gate_full, od);
        comm.all_gather_cols(a, a_full);
        comm.all_gather_cols(gate, z_full);
        be.rmsnorm_mul_sigmoid(a_full, l.o_norm, eps, z_full, a_full);
        be.copy_cols(a_full, k.r * (od / n), a);
      } else {
        // The split norm: the row's Σ x² from every rank's columns, then each rank norms and
        // gates its own (its columns of o_norm's weight, its z columns).
        Tensor ss = rows(k.sum_squares, 1);
        be.row_sum_squares(a, ss);
        comm.all_reduce_sum_f32(ss);
        const int64_t cols = od / n;
        const Tensor w_cols{static_cast<char*>(l.o_norm.data) +
                                size_t(k.r * cols) * dtype_size(l.o_norm.dtype),
                            l.o_norm.dtype, 1, cols};
        be.rmsnorm_mul_sigmoid_ss(a, ss, od, w_cols, eps, gate, a);
      }
    }
    // Row-parallel o_proj: the rank's [T, od/n] by its [H, od/n] slice, summed over the ranks.
    be.linear(a, l.o_proj, mix);
    comm.all_reduce_sum(mix);
    be.add_scaled_rmsnorm(h, mix, alpha, l.post_attention_layernorm, eps, x);
    // Column-parallel gate/up ([T, I/n] each), row-parallel down_proj, one all-reduce.
    be.linear_silu_mul(x, l.gate_up, g, u);
    be.linear(g, l.down_proj, mix);
    comm.all_reduce_sum(mix);
    const Tensor& next_norm =
        i + 1 < c.num_hidden_layers ? w.layers[size_t(i) + 1].input_layernorm : w.norm;
    be.add_scaled_rmsnorm(h, mix, alpha, next_norm, eps, x);
    trace_rows(h);
  }
  trace_rows(x);
  const int64_t G = limits_.max_logit_rows, Vn = k.vocab1 - k.vocab0;
  Tensor z{k.logit_in.data, k.logit_in.dtype, R, c.hidden_size};
  if (R > 0) be.gather_logit_rows(x, z);
  if (extra) {
    // Prompt logprob rows in runs of consecutive rows (as Model::extra_logprobs): each run's
    // vocab shards gathered into rank 0's logits, where the log-softmax runs.
    const size_t ne = extra->rows.size(), tn = size_t(extra->top_n);
    if (k.r == 0) {
      SALA_CHECK(extra->targets.size() == ne && extra->top_n >= 0 && extra->top_n <= kMaxTopLogprobs);
      extra->logprob.resize(ne);
      extra->top_ids.resize(ne * tn);
      extra->top_logprobs.resize(ne * tn);
    }
    std::vector<int32_t> iota(static_cast<size_t>(G));
    for (size_t i = 0; i < iota.size(); ++i) iota[i] = int32_t(i);
    for (size_t i = 0; i < ne;) {
      size_t j = i + 1;
      while (j < ne && int64_t(j - i) < G && extra->rows[j] == extra->rows[j - 1] + 1) ++j;
      SALA_CHECK(extra->rows[i] >= 0 && extra->rows[j - 1] < T &&
                     (i == 0 || extra->rows[i] > extra->rows[i - 1]),
                 "extra logprob rows must be ascending step rows");
      const int64_t m = int64_t(j - i);
      Tensor xs = x.slice_rows(extra->rows[i], m);
      Tensor part{k.logits_part.data, DType::F32, m, Vn};
      Tensor out{logits.data, DType::F32, m, c.vocab_size};
      be.div_scalar(xs, c.logit_divisor());
      be.linear(xs, w.lm_head, part);
      comm.gather_cols(part, out, 0);
      if (k.r == 0)
        be.logprobs_rows(out, iota.data(), extra->targets.data() + i, m, extra->top_n,
                         extra->logprob.data() + i, extra->top_ids.data() + i * tn,
                         extra->top_logprobs.data() + i * tn);
      i = j;
    }
  }
  if (R == 0) return;
  be.div_scalar(z, c.logit_divisor());
  Tensor part{k.logits_part.data, DType::F32, R, Vn};
  be.linear(z, w.lm_head, part);
}

}  // namespace sala
