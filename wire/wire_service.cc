#include "wire/wire_service.h"

#include <string>
#include <utility>

namespace tokenselect::wire {

v1::FinishReason ToWire(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case engine::FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case engine::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToWire(const engine::KvLayout& l, v1::KvLayout* out) {
  out->set_num_layers(l.num_layers);
  out->set_num_kv_heads(l.num_kv_heads);
  out->set_head_dim(l.head_dim);
  out->set_dtype(static_cast<v1::KvDType>(l.dtype));
}

engine::KvBlock ToEngine(v1::KvChunk* c) {
  engine::KvBlock b;
  b.sequence = c->sequence();
  b.layer_begin = c->layer_begin();
  b.layer_end = c->layer_end();
  b.token_begin = c->token_begin();
  b.token_end = c->token_end();
  b.dtype = static_cast<engine::KvDType>(c->dtype());
  b.shape.assign(c->shape().begin(), c->shape().end());
  if (c->has_checksum()) b.checksum = c->checksum();
  b.data.swap(*c->mutable_data());
  b.link_id = c->link_id();
  return b;
}

engine::KvFinal ToEngine(v1::KvFinal* f) {
  engine::KvFinal out;
  out.first_token_id = f->first_token_id();
  if (f->has_first_token_logprob()) out.first_token_logprob = f->first_token_logprob();
  for (const v1::TokenLogprob& t : f->first_top_logprobs()) {
    out.first_top_logprobs.push_back({t.token_id(), t.logprob()});
  }
  out.seed = f->seed();
  out.num_chunks = f->num_chunks();
  out.prefill_seconds = f->prefill_seconds();
  out.selection_states.reserve(static_cast<size_t>(f->selection_states_size()));
  for (std::string& state : *f->mutable_selection_states()) {
    out.selection_states.push_back(std::move(state));
  }
  return out;
}

engine::KvLayout ToEngine(const v1::KvLayout& l) {
  engine::KvLayout out;
  out.num_layers = l.num_layers();
  out.num_kv_heads = l.num_kv_heads();
  out.head_dim = l.head_dim();
  out.dtype = static_cast<engine::KvDType>(l.dtype());
  return out;
}

void ToWire(engine::KvBlock b, v1::KvChunk* out) {
  out->set_sequence(b.sequence);
  out->set_layer_begin(b.layer_begin);
  out->set_layer_end(b.layer_end);
  out->set_token_begin(b.token_begin);
  out->set_token_end(b.token_end);
  out->set_dtype(static_cast<v1::KvDType>(b.dtype));
  for (int64_t d : b.shape) out->add_shape(d);
  if (b.checksum.has_value()) out->set_checksum(*b.checksum);
  out->set_data(std::move(b.data));
  if (!b.link_id.empty()) out->set_link_id(std::move(b.link_id));
}

void ToWire(const engine::KvFinal& f, v1::KvFinal* out) {
  out->set_first_token_id(f.first_token_id);
  if (f.first_token_logprob.has_value()) out->set_first_token_logprob(*f.first_token_logprob);
  for (const engine::TokenLogprob& t : f.first_top_logprobs) {
    v1::TokenLogprob* e = out->add_first_top_logprobs();
    e->set_token_id(t.token_id);
    e->set_logprob(t.logprob);
  }
  out->set_seed(f.seed);
  out->set_num_chunks(f.num_chunks);
  out->set_prefill_seconds(f.prefill_seconds);
  for (const std::string& state : f.selection_states) out->add_selection_states(state);
}

}  // namespace tokenselect::wire
