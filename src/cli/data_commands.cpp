// `baton pack` (commands.hpp): a curriculum's dataset as packed shards.
#include <fmt/format.h>

#include "baton/data.hpp"
#include "baton/inference.hpp"
#include "commands.hpp"

namespace baton::cli {

int pack(const PackArgs& a, const Registry& registry) {
  auto cur = load_curriculum(a.config, a.sets, registry);
  if (!cur) return report(cur.error());
  auto ds = cur->dataset(a.data);
  if (!ds) return report(ds.error());
  data::PackOptions o;
  o.records_per_shard = a.records_per_shard;
  // Images keep their 8-bit pixels (4x smaller) and the dataset's scaling, read back exactly.
  if (!a.as_float)
    if (auto card = cur->model_card(a.data); card && card->input == InputKind::image)
      o.pixels = data::ImageOptions{card->normalize, card->mean, card->std};
  auto sum = data::pack(*ds, a.out, o);
  if (!sum) return report(sum.error());
  fmt::print("{}: {} samples of \"{}\" in {} shard(s), {:.1f} MB ({}); train on it with "
             "[datasets.<name>] kind = \"shards\", dir = \"{}\"\n",
             a.out, sum->samples, ds->name, sum->shards, static_cast<double>(sum->bytes) / 1e6,
             o.pixels ? "8-bit pixels" : "float32 inputs", a.out);
  return exit_ok;
}

}  // namespace baton::cli
