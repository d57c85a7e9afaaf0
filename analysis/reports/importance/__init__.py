"""Which experts matter on a dataset: the causal effect of dropping each routing option, teacher-forced
on the dataset's text, beside a random-expert control, cheap proxies and a pruning what-if.

For every chosen (layer, option) the dataset is run with that option dropped alone (`Ablation`), and
compared position by position with the unablated run over every predicted position (each row's
tokens after its first):
- `delta_nll`: mean next-token NLL ablated minus unablated, token-weighted, with a 95% bootstrap
  interval over rows (`delta_nll_low` / `delta_nll_high`, `bootstrap` resamples, seeded);
- `kl`: mean KL(unablated || ablated) of the next-token distributions;
- `flip_rate`: the share of positions whose top-1 prediction changes;
- `usage`: the option's share of the top-k slots of the layer over the dataset's tokens (unablated).
The control drops a random expert of the same layer (`control_draws` seeded draws): where an effect's
interval lies above the control's, that expert stands out (`outside_control`). Proxies: gate-weighted
usage (the option's share of routing weight) and REAP (mean over the tokens routed to the expert of
router weight x the norm of the expert's own output, HF models), each with its Spearman correlation
with `delta_nll` per layer. Pruning: per N, the dataset loss with the N least important experts of
every layer dropped at once, ranked by causal effect, by usage and at random.

Effects are measured in float32 by default (`float32_copy`): in bfloat16 rounding alone moves log p
by about as much as one expert's effect (README "Which experts matter").

Two mechanisms make the sweep cheaper than one full forward per ablation, both equal to it (tests):
prefix reuse (HF models: `HFModel.capture` keeps each decoder layer's input, `resume` restarts there,
so an ablation at layer l runs layers l.. only) and many ablations per forward (the batch repeated,
each copy under its own ablation: `row_ablations`). Families without them run the naive loop.

The modules: `plan` (settings, the dataset's token rows, the layers and options measured, control
draws, pruning orders), `measure` (effects of ablations on a batch; the proxies), `cache` (measured
rows kept so a rerun resumes), `ray_workers` (batches on Ray actors) and `sweep` (the whole sweep and
its tables). The public API is here: `importance`, `ImportanceSettings`, `ImportanceResult`.
"""
from routescope.analysis.reports.importance.measure import restart_reproduces, reuse_reproduces
from routescope.analysis.reports.importance.plan import (ImportanceResult, ImportanceSettings, pruning_ablation, ranked,
                                                         scope_of, tokens_of)
from routescope.analysis.reports.importance.sweep import PHASES, dataset_loss, importance, outside_control

__all__ = ["PHASES", "ImportanceResult", "ImportanceSettings", "dataset_loss", "importance", "outside_control",
           "pruning_ablation", "ranked", "restart_reproduces", "reuse_reproduces", "scope_of", "tokens_of"]
