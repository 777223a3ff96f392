"""A Hugging Face Trainer script, tuned and searched through autotune's callback (pip install 'autotune[transformers]').

Plain:                       python examples/train_hf.py
With a recipe:               autotune run --recipe best.env -- python examples/train_hf.py
Searched:                    autotune search --budget 5m -- python examples/train_hf.py   (the callback tells 16)

A 2-layer BERT-style classifier built from its config (random weights, nothing downloaded) on random token ids
whose label is in the tokens. It trains ``MAX_STEPS`` steps (default 2000) or ``TRAIN_S`` seconds after 5 warm-up
steps (default 8), whichever ends first, and prints one JSON line: samples/s after the warm-up, the threads torch
uses, the last loss and whether a recipe was applied. In a search's copy it trains until the search stops it.
"""
import json
import os
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

from autotune.integrations.transformers import AutotuneCallback, tuned_arguments


class Tokens(torch.utils.data.Dataset):
    """Random token ids; the label is whether token 7 occurs, so the loss can fall."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": int((ids == 7).any())}


class Timed(TrainerCallback):
    """Samples per second after the first 5 steps (the warm-up); training stops after ``seconds`` of them."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 5:
            self.start, self.at = time.perf_counter(), 5
        elif state.global_step > 5 and time.perf_counter() - self.start >= self.seconds:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        samples = (state.global_step - self.at) * args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.rate = samples / (time.perf_counter() - self.start)


torch.manual_seed(0)
config = BertConfig(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=256, max_position_embeddings=64, num_labels=2)
model = BertForSequenceClassification(config)
args = tuned_arguments(TrainingArguments(output_dir="out", per_device_train_batch_size=16, learning_rate=1e-4,
                                         max_steps=int(os.environ.get("MAX_STEPS", "2000")), report_to="none",
                                         save_strategy="no", logging_steps=50, disable_tqdm=True, use_cpu=True))
# A script-mode search (autotune search -- python examples/train_hf.py) stops its copies itself.
timed = Timed(float("inf") if os.environ.get("AUTOTUNE_TRIAL") else float(os.environ.get("TRAIN_S", "8")))
trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[AutotuneCallback(), timed])
result = trainer.train()
print(json.dumps({"samples_per_s": timed.rate, "threads": torch.get_num_threads(), "loss": result.training_loss,
                  "tuned": bool(os.environ.get("AUTOTUNE_RECIPE"))}))
