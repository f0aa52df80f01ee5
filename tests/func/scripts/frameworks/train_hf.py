"""A typical Hugging Face Trainer script: a tiny GPT-2 from a config, synthetic tokens, report_to mlflow."""
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(Dataset):
    def __init__(self, n: int, length: int = 16, vocab: int = 64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))


def training_arguments() -> TrainingArguments:
    return TrainingArguments(output_dir="checkpoints/hf", max_steps=30, per_device_train_batch_size=8,
                             learning_rate=1e-3, save_steps=10, logging_steps=5, eval_strategy="steps",
                             eval_steps=10, report_to=["mlflow"], seed=42, use_cpu=True,
                             load_best_model_at_end=True, metric_for_best_model="eval_loss",
                             save_total_limit=2)


def main():
    trainer = Trainer(model=tiny_gpt2(), args=training_arguments(), train_dataset=Tokens(64),
                      eval_dataset=Tokens(16))
    trainer.train()
    print("eval", trainer.evaluate())
    print("best", trainer.state.best_model_checkpoint)


if __name__ == "__main__":
    main()
