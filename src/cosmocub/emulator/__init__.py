"""Field-to-field learning (model.name unet): pairs of redshift channels, the U-Net's run config,
its validation and its evaluation against linear growth."""
