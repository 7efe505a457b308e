//! Text for a causal language model: a real English corpus from one of
//! Debian's packages, a byte-level tokenizer, seeded train/validation splits
//! by document, and a seeded synthetic text for tests.
//!
//! - The corpus is Debian's `fortunes` package (installed by `cargo xtask
//!   provision`, read from [`DEFAULT_DIR`] or `$ESPER_TEXT_CORPUS_DIR`): the
//!   BSD fortune-cookie files, about 2.4 MB of English text in some 14,000
//!   short documents separated by lines holding `%`. Its licence is in
//!   `/usr/share/doc/fortunes/copyright` (the collection is BSD-licensed by
//!   The Regents of the University of California). Nothing is downloaded at
//!   run time.
//! - [`ByteTokenizer`]: every byte is a token ([`VOCABULARY`] 256); text in
//!   any encoding round-trips exactly.
//! - [`load`]: the documents in a seeded order, a fraction of them for
//!   validation (so no window straddles the split), each part joined into
//!   one stream and cut into windows of `context + 1` tokens that overlap by
//!   one: inputs are a window's first `context` tokens, targets its last
//!   `context` ([`Dataset::sequences`]).
//! - [`synthetic`]: a seeded text with learnable structure (a fixed
//!   successor for most tokens), for fast tests.

use std::path::{Path, PathBuf};

use tch::Tensor;

use super::limits::invalid_field;
use super::shuffle::permutation;
use super::{DataError, Dataset, Result, torch_error};

/// Environment variable naming the corpus folder.
pub const DIR_ENV: &str = "ESPER_TEXT_CORPUS_DIR";
/// Where Debian's `fortunes` package puts its files.
pub const DEFAULT_DIR: &str = "/usr/share/games/fortunes";
/// Tokens of the byte-level tokenizer.
pub const VOCABULARY: usize = 256;
/// Context length (tokens per window) unless told otherwise.
pub const DEFAULT_CONTEXT: usize = 64;
/// Most bytes read from the corpus folder, all files together (64 MiB).
pub const MAX_CORPUS_BYTES: u64 = 64 << 20;
/// Longest context a window may have.
pub const MAX_CONTEXT: usize = 4_096;
/// Bytes between two documents in a stream.
const SEPARATOR: &[u8] = b"\n\n";

/// The byte-level tokenizer: token `b` is byte `b`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// Tokens of `text`, one per byte.
    pub fn encode(self, text: &[u8]) -> Vec<i64> {
        text.iter().map(|&byte| i64::from(byte)).collect()
    }

    /// The bytes of `tokens`.
    ///
    /// # Errors
    /// [`DataError::InvalidArgument`] naming the first token outside
    /// `0..256`.
    pub fn decode(self, tokens: &[i64]) -> Result<Vec<u8>> {
        tokens
            .iter()
            .enumerate()
            .map(|(index, &token)| {
                u8::try_from(token).map_err(|_| DataError::InvalidArgument {
                    op: "ByteTokenizer::decode",
                    reason: format!("token {token} at {index} is outside 0..{VOCABULARY}"),
                })
            })
            .collect()
    }
}

/// What [`load`] reads and how it cuts it.
#[derive(Debug, Clone, PartialEq)]
pub struct TextOptions {
    /// Corpus folder; `None`: `$ESPER_TEXT_CORPUS_DIR`, else [`DEFAULT_DIR`].
    pub dir: Option<PathBuf>,
    /// Tokens per window (1..=[`MAX_CONTEXT`]).
    pub context: usize,
    /// Share of the documents held out for validation (in `(0, 1)`).
    pub validation_fraction: f64,
    /// Seed of the documents' order.
    pub seed: u64,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            dir: None,
            context: DEFAULT_CONTEXT,
            validation_fraction: 0.1,
            seed: 0,
        }
    }
}

impl TextOptions {
    /// The folder [`load`] reads: `dir`, else `$ESPER_TEXT_CORPUS_DIR` (if
    /// set and not empty), else [`DEFAULT_DIR`].
    pub fn corpus_dir(&self) -> PathBuf {
        if let Some(dir) = &self.dir {
            return dir.clone();
        }
        match std::env::var_os(DIR_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => PathBuf::from(DEFAULT_DIR),
        }
    }

    fn validate(&self) -> Result<()> {
        const OP: &str = "TextOptions";
        if self.context == 0 || self.context > MAX_CONTEXT {
            return Err(invalid_field(
                OP,
                "context",
                self.context,
                format!("1..={MAX_CONTEXT}"),
            ));
        }
        if !(self.validation_fraction > 0.0 && self.validation_fraction < 1.0) {
            return Err(invalid_field(
                OP,
                "validation_fraction",
                self.validation_fraction,
                "a fraction in (0, 1)",
            ));
        }
        Ok(())
    }
}

fn hint() -> String {
    format!(
        "Install Debian's fortunes package (`cargo xtask provision` does) or point \
         TextOptions::dir or {DIR_ENV} at a folder of text files whose documents are \
         separated by lines holding `%`."
    )
}

/// The documents of every corpus file in `dir`: regular files, in name
/// order, whose names have no extension (`fortunes` keeps an index `.dat`
/// and links `.u8` beside each file), split at lines holding only `%`;
/// empty documents are dropped.
///
/// # Errors
/// [`DataError::MissingDirectory`] without the folder; [`DataError::Io`] for
/// a file that cannot be read; [`DataError::TooLarge`] past
/// [`MAX_CORPUS_BYTES`]; [`DataError::InvalidArgument`] for a folder without
/// a document.
pub fn read_documents(dir: &Path) -> Result<Vec<Vec<u8>>> {
    const OP: &str = "text::read_documents";
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataError::Io {
            path,
            source,
            hint: hint(),
        }
    };
    if !dir.is_dir() {
        return Err(DataError::MissingDirectory {
            path: dir.to_path_buf(),
            hint: hint(),
        });
    }
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io(&path))?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if kind.is_file() && !hidden && path.extension().is_none() {
            files.push(path);
        }
    }
    files.sort();
    let mut total = 0_u64;
    let mut documents = Vec::new();
    for path in files {
        let size = std::fs::metadata(&path).map_err(io(&path))?.len();
        total = total.saturating_add(size);
        if total > MAX_CORPUS_BYTES {
            return Err(DataError::TooLarge {
                op: OP,
                what: format!("the corpus in {} ({total} bytes so far)", dir.display()),
                limit: MAX_CORPUS_BYTES,
            });
        }
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let mut document: Vec<u8> = Vec::new();
        for line in bytes.split_inclusive(|&byte| byte == b'\n') {
            if line.strip_suffix(b"\n").unwrap_or(line) == b"%" {
                push_document(&mut documents, &mut document);
            } else {
                document.extend_from_slice(line);
            }
        }
        push_document(&mut documents, &mut document);
    }
    if documents.is_empty() {
        return Err(DataError::InvalidArgument {
            op: OP,
            reason: format!("{} holds no document. {}", dir.display(), hint()),
        });
    }
    Ok(documents)
}

fn push_document(documents: &mut Vec<Vec<u8>>, document: &mut Vec<u8>) {
    let text = std::mem::take(document);
    let start = text.iter().position(|b| !b.is_ascii_whitespace());
    let end = text.iter().rposition(|b| !b.is_ascii_whitespace());
    if let (Some(start), Some(end)) = (start, end) {
        documents.push(text.get(start..=end).unwrap_or_default().to_vec());
    }
}

/// The documents joined into one token stream, cut into windows of
/// `context + 1` tokens that overlap by one, as a [`Dataset::sequences`];
/// the stream's tail shorter than a window is dropped.
///
/// # Errors
/// [`DataError::InvalidArgument`] when the documents make no whole window;
/// errors of [`Dataset::sequences`].
pub fn windows(name: &str, documents: &[&[u8]], context: usize) -> Result<Dataset> {
    const OP: &str = "text::windows";
    let mut stream: Vec<i64> = Vec::new();
    for (index, document) in documents.iter().enumerate() {
        if index > 0 {
            stream.extend(ByteTokenizer.encode(SEPARATOR));
        }
        stream.extend(ByteTokenizer.encode(document));
    }
    let count = stream
        .len()
        .saturating_sub(1)
        .checked_div(context)
        .unwrap_or(0);
    if count == 0 || context == 0 {
        return Err(DataError::InvalidArgument {
            op: OP,
            reason: format!(
                "{name}: {} tokens make no window of {} tokens",
                stream.len(),
                context.saturating_add(1)
            ),
        });
    }
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for window in 0..count {
        let start = window.saturating_mul(context);
        let end = start.saturating_add(context);
        inputs.extend_from_slice(stream.get(start..end).unwrap_or_default());
        targets.extend_from_slice(
            stream
                .get(start.saturating_add(1)..end.saturating_add(1))
                .unwrap_or_default(),
        );
    }
    let shape = [
        i64::try_from(count).unwrap_or(i64::MAX),
        i64::try_from(context).unwrap_or(i64::MAX),
    ];
    let inputs = Tensor::f_from_slice(&inputs)
        .and_then(|t| t.f_reshape(shape))
        .map_err(torch_error(OP))?;
    let targets = Tensor::f_from_slice(&targets)
        .and_then(|t| t.f_reshape(shape))
        .map_err(torch_error(OP))?;
    Dataset::sequences(name, inputs, targets, VOCABULARY)
}

/// The corpus as training and validation windows, in that order (named
/// `fortunes-train` and `fortunes-validation`): the documents of
/// [`read_documents`] in the seeded order of `options.seed`, the first
/// `validation_fraction` of them (at least one) for validation.
///
/// # Errors
/// Those of [`read_documents`] and [`windows`] (a part too small for one
/// window), and [`DataError::InvalidField`] for bad options.
pub fn load(options: &TextOptions) -> Result<(Dataset, Dataset)> {
    options.validate()?;
    let documents = read_documents(&options.corpus_dir())?;
    let order = permutation(documents.len(), options.seed)?;
    let held_out = ((documents.len() as f64) * options.validation_fraction).round() as usize;
    let held_out = held_out.clamp(1, documents.len().saturating_sub(1).max(1));
    let pick = |range: std::ops::Range<usize>| -> Vec<&[u8]> {
        order
            .get(range)
            .unwrap_or_default()
            .iter()
            .filter_map(|&index| usize::try_from(index).ok())
            .filter_map(|index| documents.get(index).map(Vec::as_slice))
            .collect()
    };
    let validation = pick(0..held_out);
    let train = pick(held_out..documents.len());
    Ok((
        windows("fortunes-train", &train, options.context)?,
        windows("fortunes-validation", &validation, options.context)?,
    ))
}

/// A seeded text of `windows` windows of `context` tokens over
/// `vocabulary` tokens: each token is followed by its fixed successor (a
/// seeded permutation) nine times in ten, by a random token otherwise, so a
/// model can learn it and the best loss is well below `ln(vocabulary)`.
///
/// # Errors
/// [`DataError::InvalidField`] for a size of 0 or a vocabulary of 1 or
/// above [`VOCABULARY`]; [`DataError::TooLarge`] for more than
/// [`super::limits::MAX_SAMPLES`] tokens.
pub fn synthetic(windows: usize, context: usize, vocabulary: usize, seed: u64) -> Result<Dataset> {
    const OP: &str = "text::synthetic";
    if windows == 0 || context == 0 || context > MAX_CONTEXT {
        return Err(invalid_field(
            OP,
            "windows, context",
            (windows, context),
            format!("windows >= 1 and context in 1..={MAX_CONTEXT}"),
        ));
    }
    if !(2..=VOCABULARY).contains(&vocabulary) {
        return Err(invalid_field(
            OP,
            "vocabulary",
            vocabulary,
            format!("2..={VOCABULARY}"),
        ));
    }
    let tokens = windows
        .checked_mul(context)
        .and_then(|n| n.checked_add(1))
        .filter(|&n| n <= super::limits::MAX_SAMPLES)
        .ok_or_else(|| DataError::TooLarge {
            op: OP,
            what: format!("windows x context = {windows} x {context}"),
            limit: super::limits::MAX_SAMPLES as u64,
        })?;
    let successor = permutation(vocabulary, seed)?;
    let mut rng = leyline::rng::SplitMix64::new(leyline::rng::mix64(seed ^ 0x7e57));
    let bound = vocabulary as u64;
    let mut stream = Vec::with_capacity(tokens);
    let mut token = rng.below(bound) as i64;
    for _ in 0..tokens {
        stream.push(token);
        token = if rng.below(10) < 9 {
            usize::try_from(token)
                .ok()
                .and_then(|t| successor.get(t).copied())
                .unwrap_or(0)
        } else {
            rng.below(bound) as i64
        };
    }
    let shape = [
        i64::try_from(windows).unwrap_or(i64::MAX),
        i64::try_from(context).unwrap_or(i64::MAX),
    ];
    let window = |offset: usize| -> Result<Tensor> {
        let mut out = Vec::with_capacity(tokens.saturating_sub(1));
        for w in 0..windows {
            let start = w.saturating_mul(context).saturating_add(offset);
            out.extend_from_slice(
                stream
                    .get(start..start.saturating_add(context))
                    .unwrap_or_default(),
            );
        }
        Tensor::f_from_slice(&out)
            .and_then(|t| t.f_reshape(shape))
            .map_err(torch_error(OP))
    };
    Dataset::sequences("synthetic-text", window(0)?, window(1)?, vocabulary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write");
        }
        dir
    }

    #[test]
    fn bytes_round_trip_and_bad_tokens_are_named() {
        let text = "Ünïcode and ASCII\n".as_bytes();
        let tokens = ByteTokenizer.encode(text);
        assert_eq!(tokens.len(), text.len());
        assert_eq!(ByteTokenizer.decode(&tokens).expect("decode"), text);
        let error = ByteTokenizer
            .decode(&[65, 256])
            .expect_err("256 is no byte");
        assert!(error.to_string().contains("token 256 at 1"), "{error}");
    }

    #[test]
    fn documents_split_at_percent_lines_and_index_files_are_skipped() {
        let dir = corpus(&[
            ("b", "second file\n%\n"),
            ("a", "one\n%\n  two  \nlines\n%\n\n%\nthree"),
            ("a.dat", "binary index"),
            (".hidden", "no"),
        ]);
        let documents = read_documents(dir.path()).expect("documents");
        let text: Vec<&str> = documents
            .iter()
            .map(|d| std::str::from_utf8(d).expect("utf-8"))
            .collect();
        assert_eq!(text, ["one", "two  \nlines", "three", "second file"]);
    }

    #[test]
    fn windows_overlap_by_one_and_targets_are_the_next_tokens() {
        let data = windows("t", &[b"abcdefg", b"hi"], 3).expect("windows");
        // "abcdefg\n\nhi": 11 tokens make 3 windows of 3 (+1).
        assert_eq!(data.len(), 3);
        let inputs = Vec::<i64>::try_from(data.images().reshape([-1])).expect("inputs");
        let targets = Vec::<i64>::try_from(data.labels().reshape([-1])).expect("targets");
        assert_eq!(
            ByteTokenizer.decode(&inputs).expect("bytes"),
            b"abcdefg\n\n"
        );
        assert_eq!(
            ByteTokenizer.decode(&targets).expect("bytes"),
            b"bcdefg\n\nh"
        );
        assert!(data.is_sequences());
        assert_eq!(data.n_classes(), VOCABULARY);
    }

    #[test]
    fn the_split_is_by_document_seeded_and_refuses_what_cannot_be_cut() {
        let docs: String = (0..40)
            .map(|i| format!("document number {i:02}\n%\n"))
            .collect();
        let dir = corpus(&[("all", &docs)]);
        let options = TextOptions {
            dir: Some(dir.path().to_path_buf()),
            context: 8,
            validation_fraction: 0.25,
            seed: 3,
        };
        let (train, validation) = load(&options).expect("load");
        let (train2, validation2) = load(&options).expect("load again");
        assert!(train.images().equal(train2.images()));
        assert!(validation.images().equal(validation2.images()));
        // 10 of 40 documents held out: about a quarter of the tokens.
        let share = validation.len() as f64 / (train.len() + validation.len()) as f64;
        assert!((0.15..0.35).contains(&share), "validation share {share}");
        let other = load(&TextOptions {
            seed: 4,
            ..options.clone()
        })
        .expect("load");
        assert!(
            !validation.images().equal(other.1.images()),
            "the seed picks the documents"
        );

        let missing = load(&TextOptions {
            dir: Some(dir.path().join("nowhere")),
            ..options.clone()
        })
        .expect_err("no folder");
        assert!(
            matches!(missing, DataError::MissingDirectory { .. }),
            "{missing}"
        );
        assert!(missing.to_string().contains("fortunes"), "{missing}");
        let empty = corpus(&[("empty", "%\n%\n")]);
        let error = load(&TextOptions {
            dir: Some(empty.path().to_path_buf()),
            ..options.clone()
        })
        .expect_err("no document");
        assert!(error.to_string().contains("no document"), "{error}");
        for bad in [
            TextOptions {
                context: 0,
                ..options.clone()
            },
            TextOptions {
                validation_fraction: 1.0,
                ..options.clone()
            },
            TextOptions {
                validation_fraction: f64::NAN,
                ..options.clone()
            },
        ] {
            assert!(load(&bad).is_err(), "{bad:?}");
        }
        let tiny = corpus(&[("tiny", "ab\n%\ncd")]);
        let error = load(&TextOptions {
            dir: Some(tiny.path().to_path_buf()),
            context: 64,
            ..options
        })
        .expect_err("too small for a window");
        assert!(error.to_string().contains("no window"), "{error}");
    }

    #[test]
    fn sequence_data_sets_refuse_bad_shapes_kinds_and_tokens() {
        let tokens = |values: &[i64], shape: [i64; 2]| Tensor::from_slice(values).reshape(shape);
        let good = tokens(&[1, 2, 3, 4], [2, 2]);
        assert!(Dataset::sequences("ok", good.copy(), good.copy(), 5).is_ok());
        let cases: Vec<(Tensor, Tensor, usize, &str)> = vec![
            (good.copy(), good.copy(), 0, "vocabulary"),
            (good.to_kind(tch::Kind::Float), good.copy(), 5, "inputs"),
            (good.reshape([4]), good.reshape([4]), 5, "inputs"),
            (good.copy(), tokens(&[1, 2], [1, 2]), 5, "targets.shape"),
            (
                good.copy(),
                tokens(&[1, 2, 3, 9], [2, 2]),
                5,
                "label 9 of sample 1",
            ),
            (
                tokens(&[-1, 2, 3, 4], [2, 2]),
                good.copy(),
                5,
                "label -1 of sample 0",
            ),
        ];
        for (inputs, targets, vocabulary, expected) in cases {
            let error = Dataset::sequences("bad", inputs, targets, vocabulary).expect_err(expected);
            assert!(error.to_string().contains(expected), "{expected}: {error}");
        }
    }

    #[test]
    fn synthetic_text_is_seeded_in_range_and_mostly_follows_successors() {
        let a = synthetic(20, 16, 32, 5).expect("text");
        let b = synthetic(20, 16, 32, 5).expect("text");
        assert!(a.images().equal(b.images()) && a.labels().equal(b.labels()));
        assert_eq!(a.images().size(), [20, 16]);
        let max = a.images().max().int64_value(&[]);
        assert!((0..32).contains(&max));
        // Inputs shifted by one are the targets.
        let inputs = a.images().reshape([-1]);
        let targets = a.labels().reshape([-1]);
        assert!(inputs.narrow(0, 1, 319).equal(&targets.narrow(0, 0, 319)));
        for (windows, context, vocabulary) in [(0, 4, 8), (4, 0, 8), (4, 4, 1), (4, 4, 257)] {
            assert!(synthetic(windows, context, vocabulary, 0).is_err());
        }
    }
}
