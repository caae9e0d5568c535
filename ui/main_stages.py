"""Words for the model store's progress stages, shared by the main window and the model manager."""

STAGES = {"assemble": "Assembling the model file", "convert": "Converting the model (once)",
          "quantize": "Quantizing to 4 bits (once)", "download": "Downloading", "copy": "Copying",
          "verify": "Verifying", "pip": "Installing the model's data packages"}
