"""The on-policy patch (--patch on-policy, docs/method.md §5): the policy itself writes the
thought of each patch, prompted again with a hint naming the expert action.
rollout.semi_online_rollout imports this module only at a step where such patches are due; the
other patch modes are patch.make_patch's."""
import gui
import patch
from schedule import stable_seed


def patch_on_policy(sampler, prompt_for, episodes, states, to_patch, t: int, task_seeds,
                    greedy: bool) -> None:
    """Fill the history entry each rollout of `to_patch` left open at step t (rollout._advance):
    to_patch holds (task k, rollout i, its StepRecord, the screenshot's original size). All
    patches of the step come from one sampler call (patch.on_policy_patches); each is seeded per
    (task, rollout) like the samples (schedule.stable_seed), so a patch depends on neither the batch
    nor the rank."""
    # the expert action in the pixels the policy saw
    actions = [gui.scale_action(episodes[k].steps[t].action, orig, rec.prompt.resized_size)
               for k, _, rec, orig in to_patch]
    hint_prompts = [prompt_for(k, t, rec.history, hint=patch.on_policy_hint(a))
                    for (k, _, rec, _), a in zip(to_patch, actions)]
    hint_seeds = None if task_seeds is None else [
        stable_seed(task_seeds[k], episodes[k].episode_id, t, ("patch", i, *rec.history))
        for k, i, rec, _ in to_patch]

    def gen(ps):
        return [o[0].text for o in sampler.generate(ps, n=1, greedy=greedy, seeds=hint_seeds)]
    for (k, i, _, _), text in zip(to_patch, patch.on_policy_patches(hint_prompts, actions, gen)):
        states[k][i].history[-1] = text
