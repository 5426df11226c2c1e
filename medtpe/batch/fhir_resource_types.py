"""The resource type names of FHIR R4 (4.0.1): what a Bulk Data manifest's `output[].type` may be.

The Bulk Data client names its local files after the type (`<Type>.<k>.ndjson`), so a type is
checked against this fixed list before it becomes part of a file name.
"""

from __future__ import annotations

_NAMES = """
    Account ActivityDefinition AdverseEvent AllergyIntolerance Appointment AppointmentResponse
    AuditEvent Basic Binary BiologicallyDerivedProduct BodyStructure Bundle CapabilityStatement
    CarePlan CareTeam CatalogEntry ChargeItem ChargeItemDefinition Claim ClaimResponse
    ClinicalImpression CodeSystem Communication CommunicationRequest CompartmentDefinition
    Composition ConceptMap Condition Consent Contract Coverage CoverageEligibilityRequest
    CoverageEligibilityResponse DetectedIssue Device DeviceDefinition DeviceMetric DeviceRequest
    DeviceUseStatement DiagnosticReport DocumentManifest DocumentReference EffectEvidenceSynthesis
    Encounter Endpoint EnrollmentRequest EnrollmentResponse EpisodeOfCare EventDefinition Evidence
    EvidenceVariable ExampleScenario ExplanationOfBenefit FamilyMemberHistory Flag Goal
    GraphDefinition Group GuidanceResponse HealthcareService ImagingStudy Immunization
    ImmunizationEvaluation ImmunizationRecommendation ImplementationGuide InsurancePlan Invoice
    Library Linkage List Location Measure MeasureReport Media Medication MedicationAdministration
    MedicationDispense MedicationKnowledge MedicationRequest MedicationStatement MedicinalProduct
    MedicinalProductAuthorization MedicinalProductContraindication MedicinalProductIndication
    MedicinalProductIngredient MedicinalProductInteraction MedicinalProductManufactured
    MedicinalProductPackaged MedicinalProductPharmaceutical MedicinalProductUndesirableEffect
    MessageDefinition MessageHeader MolecularSequence NamingSystem NutritionOrder Observation
    ObservationDefinition OperationDefinition OperationOutcome Organization
    OrganizationAffiliation Parameters Patient PaymentNotice PaymentReconciliation Person
    PlanDefinition Practitioner PractitionerRole Procedure Provenance Questionnaire
    QuestionnaireResponse RelatedPerson RequestGroup ResearchDefinition ResearchElementDefinition
    ResearchStudy ResearchSubject RiskAssessment RiskEvidenceSynthesis Schedule SearchParameter
    ServiceRequest Slot Specimen SpecimenDefinition StructureDefinition StructureMap Subscription
    Substance SubstanceNucleicAcid SubstancePolymer SubstanceProtein
    SubstanceReferenceInformation SubstanceSourceMaterial SubstanceSpecification SupplyDelivery
    SupplyRequest Task TerminologyCapabilities TestReport TestScript ValueSet VerificationResult
    VisionPrescription
"""
R4_RESOURCE_TYPES = frozenset(_NAMES.split())
"""The 146 concrete resource types of FHIR R4 (the `ResourceType` code system less `Resource` and
`DomainResource`)."""
