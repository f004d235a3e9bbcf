"""What a container tessera set up gets, whichever path set it up (the device plugin's
Allocate or the DRA driver's NodePrepareResources): libtessera at a versioned host path
(``library``), the mounts, environment and device visibility (``response``), and which device
files give it its units (``device_files``)."""
