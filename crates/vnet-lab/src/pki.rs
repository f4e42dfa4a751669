//! Certificates for the lab's TLS links: a CA per lab and a certificate per
//! host naming its underlay address (what vnetd checks on both sides), made
//! with rcgen into the lab's directory. A second CA makes the "stranger"
//! certificates the refusal tests need.

use crate::{Error, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// A CA that signs host certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

/// The files of one host's TLS identity.
#[derive(Debug, Clone)]
pub struct HostFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

fn err(e: rcgen::Error) -> Error {
    Error::Other(format!("certificate: {e}"))
}

impl Ca {
    pub fn new(name: &str) -> Result<Ca> {
        let key = KeyPair::generate().map_err(err)?;
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let pem = p.self_signed(&key).map_err(err)?.pem();
        Ok(Ca { issuer: Issuer::new(p, key), pem })
    }

    /// A certificate for `ip` with the key in `key_file` (PEM) that expired
    /// on 2020-01-02 (valid from 2020-01-01), as PEM.
    pub fn expired_host_pem(&self, ip: impl Into<IpAddr>, key_file: &Path) -> Result<String> {
        let pem = std::fs::read_to_string(key_file)
            .map_err(|e| Error::Other(format!("{}: {e}", key_file.display())))?;
        let key = KeyPair::from_pem(&pem).map_err(err)?;
        let mut p = CertificateParams::new(vec![ip.into().to_string()]).map_err(err)?;
        p.distinguished_name.push(DnType::CommonName, "expired");
        p.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2020, 1, 2);
        Ok(p.signed_by(&key, &self.issuer).map_err(err)?.pem())
    }

    /// Writes a certificate for `cn` (in organizations `orgs`, for the
    /// names and addresses `sans`) and its key into `dir` as `STEM.pem`,
    /// `STEM.key` (mode 0600), and the CA as `ca.pem`: the Kubernetes
    /// lab's users, components and servers.
    pub fn issue(
        &self,
        dir: &Path,
        stem: &str,
        cn: &str,
        orgs: &[&str],
        sans: &[String],
    ) -> Result<HostFiles> {
        let key = KeyPair::generate().map_err(err)?;
        let mut p = CertificateParams::new(sans.to_vec()).map_err(err)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name.push(DnType::OrganizationName, *o);
        }
        p.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &self.issuer).map_err(err)?;
        let files = HostFiles {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
            ca: dir.join("ca.pem"),
        };
        write_files(&files, &cert.pem(), &key.serialize_pem(), &self.pem)?;
        Ok(files)
    }

    /// Writes the CA certificate and a certificate and key for `ip` into
    /// `dir` as `NAME-ca.pem`, `NAME.pem`, `NAME.key` (key mode 0600).
    pub fn host(&self, dir: &Path, name: &str, ip: impl Into<IpAddr>) -> Result<HostFiles> {
        let key = KeyPair::generate().map_err(err)?;
        let mut p = CertificateParams::new(vec![ip.into().to_string()]).map_err(err)?;
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &self.issuer).map_err(err)?;
        let files = HostFiles {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
            ca: dir.join(format!("{name}-ca.pem")),
        };
        write_files(&files, &cert.pem(), &key.serialize_pem(), &self.pem)?;
        Ok(files)
    }
}

/// Writes a certificate, its key (mode 0600) and its CA.
fn write_files(files: &HostFiles, cert: &str, key: &str, ca: &str) -> Result<()> {
    let write = |path: &Path, text: &str| {
        std::fs::write(path, text).map_err(|e| Error::Other(format!("{}: {e}", path.display())))
    };
    write(&files.cert, cert)?;
    write(&files.key, key)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::Other(format!("{}: {e}", files.key.display())))?;
    write(&files.ca, ca)
}
