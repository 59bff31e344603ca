"""Student cross-encoders, their LightningModule and DataModule (the student stage)."""
