"""Fine-tuning (Problem 3): LoRA adapters and DeepSpeed ZeRO.

- ``finetune.lora``: ``LoRALinear`` (provided); ``apply_lora`` (3.1);
  ``save_adapter``, ``load_adapter`` (3.2); ``adapter_parameters`` (provided).
- ``finetune.zero``: ``build_config``, ``train_microbatch`` (3.3);
  ``init_engine``, ``prepare_deepspeed`` (provided).
- ``finetune.gpt2``: ``conv1d_to_linear``, ``lora_target_names`` (provided):
  make a Hugging Face GPT-2 ready for ``apply_lora``.
- ``finetune.peft_io``: ``export_peft_adapter``, ``read_peft_adapter``,
  ``import_peft_adapter`` (provided): PEFT's on-disk adapter layout.

Nothing is imported here, so a broken module costs only its own problem.
"""
