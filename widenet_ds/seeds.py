"""How the project derives one random stream's seed from another: the derived seed is the base times SEED_SPACING
plus a small offset (an expert's layer and index, a rank, a training step). The spacing is a prime larger than any
offset it is added to (ranks, experts, 65_537 x layers), so two different (base, offset) pairs never give the same
seed: a finetuning seed's streams never meet the next seed's, an expert's initialisation never another expert's, a
re-laid-out run's new streams never the start's. Every use must keep this value: seeds derived with it are in
checkpoints and the golden curves."""

SEED_SPACING = 1_000_003
