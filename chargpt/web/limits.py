"""The playground server's limits, named together: every request is checked against these, with a 4xx JSON error
naming the one it broke. The sampling settings' own rules (temperature >= 0, top_p in (0, 1], the seed's range...)
are chargpt.config's, checked there; these are what one request may ask of this server."""

MAX_BODY_BYTES = 256 * 1024  # a request body (the prompt is most of it)
MAX_PROMPT_CHARS = 10_000
MAX_NEW_CHARS = 5_000  # characters generated per sample
MAX_SAMPLES = 8  # samples per request (decoded together in one batch)
MAX_TEMPERATURE = 10.0
MAX_TOP_K = 1_000_000
MAX_STOPS, MAX_STOP_CHARS = 4, 100
MAX_LABEL_CHARS = 2_000  # a label's name (chargpt.data.labels.MAX_NAME: 100), or a mix of up to 16 with weights
MAX_BEAM = 16  # hypotheses a beam search keeps (--beam): each is a batch row
MAX_GUIDANCE = 100.0  # classifier-free guidance (--guidance; above a few it only sharpens)
MAX_INSIDE_CHARS = 2_000  # text analysed by Look inside
MAX_NOVELTY_CHARS = MAX_PROMPT_CHARS + MAX_NEW_CHARS  # text checked for copying (a prompt and its sample)
MAX_TOP = 10  # expected characters listed per position
VOCAB_PREVIEW = 300  # vocabulary characters a run's details show
MAX_INT_DIGITS = 100  # digits of an integer in a request (a seed has at most 19; more is a range error)
MAX_BUSY = 2  # generations and analyses at once; the next request gets 429
MAX_MODELS = 2  # loaded models kept in memory
MAX_METRIC_ROWS = 20_000  # the newest rows of a metrics.jsonl that are sent
MAX_SAMPLE_ROWS = 50  # the newest samples a run wrote while training (samples.jsonl) that are sent
MAX_RUNNING_POINTS = 2_000  # running-loss rows (train_loss.jsonl) sent: evenly thinned to at most this many
MAX_VOCAB_SENT = 20_000  # vocabulary characters sent for a run's detail (its summary counts them all)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")  # the Host names a server on this machine answers
# training from the page (chargpt/web/training.py)
MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # an uploaded text, read whole into memory and checked before it is kept
MAX_UPLOAD_FOLDER_BYTES = 1024**3  # all uploaded texts together
MAX_TRAIN_SECONDS = 7 * 24 * 3600  # a training's time budget
MAX_NAME_CHARS = 80  # a run or text name
MAX_CORPORA_LISTED = 1_000  # texts listed from one folder
TRAIN_LOG_LINES = 40  # a training's last output lines sent
TRAIN_SAMPLES = 5  # the newest samples a training wrote that are sent
MAX_FOLDER_FILES = 5_000  # files in a folder corpus the page offers (a larger one trains with chargpt train)
MAX_LISTING_FILES = 20_000  # files and folders looked at to list the data folder's folders of texts
