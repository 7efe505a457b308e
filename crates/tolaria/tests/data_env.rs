//! How the loaders pick their folder: option, then environment variable, then
//! default. One test in its own binary, because it changes the process
//! environment and tests in one binary run in parallel.

use tolaria::data::DataError;
use tolaria::data::cifar10::{self, Cifar10Options};
use tolaria::data::fashion_mnist::{self, FashionMnistOptions};

fn set_env(name: &str, value: &std::path::Path) {
    // SAFETY: this binary holds a single test, so no other thread reads or
    // writes the environment meanwhile.
    unsafe { std::env::set_var(name, value) };
}

fn remove_env(name: &str) {
    // SAFETY: as in `set_env`.
    unsafe { std::env::remove_var(name) };
}

#[test]
fn folders_come_from_the_option_then_the_environment_then_the_default() {
    let root = tempfile::tempdir().unwrap();
    let from_env = root.path().join("from-env");
    let from_option = root.path().join("from-option");

    // Fashion-MNIST: the default is the Debian package's folder.
    remove_env(fashion_mnist::DIR_ENV);
    assert_eq!(
        fashion_mnist::data_dir(&FashionMnistOptions::default()),
        std::path::PathBuf::from(fashion_mnist::DEFAULT_DIR)
    );
    set_env(fashion_mnist::DIR_ENV, &from_env);
    assert_eq!(
        fashion_mnist::data_dir(&FashionMnistOptions::default()),
        from_env
    );
    assert_eq!(
        fashion_mnist::data_dir(&FashionMnistOptions::from_dir(&from_option)),
        from_option
    );
    let err = fashion_mnist::load(FashionMnistOptions::default()).unwrap_err();
    assert!(
        matches!(err, DataError::MissingDirectory { ref path, .. } if *path == from_env),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("chosen by the environment variable ESPER_FASHION_MNIST_DIR"),
        "{message}"
    );
    assert!(message.contains("cargo xtask provision"), "{message}");
    remove_env(fashion_mnist::DIR_ENV);

    // CIFAR-10: no default; the variable is used when the option is not set.
    remove_env(cifar10::DIR_ENV);
    let err = cifar10::load(Cifar10Options::default()).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::NoDirectoryConfigured {
                dataset: "CIFAR-10",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("ESPER_CIFAR10_DIR"), "{err}");
    std::fs::create_dir(&from_env).unwrap();
    for name in cifar10::TRAIN_FILES.iter().chain([&cifar10::TEST_FILE]) {
        // One record each: label 1, pixels 0..3072 mod 256.
        let mut record = vec![1u8];
        record.extend((0..3072).map(|i| (i % 256) as u8));
        std::fs::write(from_env.join(name), record).unwrap();
    }
    set_env(cifar10::DIR_ENV, &from_env);
    let (train, test) = cifar10::load(Cifar10Options::default()).unwrap();
    assert_eq!((train.len(), test.len()), (5, 1));
    let err = cifar10::load(Cifar10Options::from_dir(&from_option)).unwrap_err();
    assert!(
        matches!(err, DataError::MissingDirectory { ref path, .. } if *path == from_option),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("chosen by Cifar10Options::dir"),
        "{message}"
    );
    remove_env(cifar10::DIR_ENV);
}
