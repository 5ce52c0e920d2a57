"""Image classification (ViT-WideNet, ViT, ViT-MoE, ParaFormer): its settings, results and task."""
