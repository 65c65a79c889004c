"""Baselines a GRPO run is compared with on the same problems and budget (docs/baselines.md).

- ``sft_bon``: the budget bookkeeping shared by all baselines, best-of-n reranking, and SFT / rejection-sampling FT;
- ``dpo``: DPO on pairs of the base model's own samples;
- ``ppo``: PPO (GAE with a learned critic) as the GRPO trainer with its advantage step replaced; ``critic``: the
  value model; ``ppo_card``: PPO's lines of the objective card;
- ``agent_sft``: the supervised warm start of agent tasks on expert episodes; ``openai_expert``: those of an
  ``openai_agent`` task (the solver behind the endpoint, the agent driving).

May import: training (PPO and DPO reuse its loop and passes), evaluation, and everything below them.
Imported by: card, report, runs, the CLI and API.
"""
